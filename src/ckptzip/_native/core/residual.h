/* residual.h - exact residuals of an array against a base array, on bit patterns.
 *
 * Every kind is a bijection for a fixed base, computed in modular integer arithmetic on the
 * elements' bit patterns, so it is bit-exact for every dtype (float subtraction is not: about 1%
 * of fp32 elements would not round-trip).  Elements are little-endian words of `width` bytes.
 *
 *   CKZ_RESIDUAL_XOR         d = new ^ base
 *   CKZ_RESIDUAL_FLOAT_DIFF  d = zigzag(mono(new) - mono(base)), where mono() maps an IEEE
 *                            sign-magnitude pattern to an unsigned integer of the same order
 *                            (negatives flipped, positives above them), so a small change of
 *                            value is a small integer whatever its sign
 *   CKZ_RESIDUAL_INT_DIFF    d = zigzag(new - base), for two's-complement and unsigned integers
 *
 * zigzag(x) = (x << 1) ^ (x >> (w-1) arithmetic) folds the sign into bit 0, so that small
 * residuals of either sign have all-zero high bytes, which the byte-plane coder then removes.
 */
#ifndef CKZ_RESIDUAL_H
#define CKZ_RESIDUAL_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

enum { CKZ_RESIDUAL_XOR = 0, CKZ_RESIDUAL_FLOAT_DIFF = 1, CKZ_RESIDUAL_INT_DIFF = 2 };
#define CKZ_RESIDUAL_KINDS 3

/* n elements of `width` bytes (1, 2, 4 or 8) in src, base and dst (dst may alias src).
 * Returns 0, or -1 if width or kind is unsupported (nothing is written then). */
int ckz_residual_encode(const uint8_t *src, const uint8_t *base, uint8_t *dst, size_t n,
                        unsigned width, unsigned kind);

/* The inverse: dst = the array whose residual against base is delta (dst may alias delta). */
int ckz_residual_decode(const uint8_t *delta, const uint8_t *base, uint8_t *dst, size_t n,
                        unsigned width, unsigned kind);

#endif /* CKZ_RESIDUAL_H */
