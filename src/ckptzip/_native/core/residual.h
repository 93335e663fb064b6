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

/* ---- delta chunks: a pipeline's chunk coding in one call ------------------------------------
 * The chunk stream of the pipelines [residual(kind, width)?, byteplanes(width, rotate), entropy]
 * (stream format 1, as ckz_encode_planes) and [residual(kind, width), ctxplanes(width, rotate)]
 * (format 3, as ckz_encode_planes_ctx with ckz_context_bytes(base, width, ctx_rotate) as the
 * context), residual, context and coding without intermediate buffers of the caller's. */
typedef struct {
    unsigned width;  /* element bytes: 1, 2, 4 or 8 (2, 4 or 8 with a context) */
    unsigned rotate; /* the planes' rotation, < 8 * width */
    int kind;        /* residual kind, or -1 for none (format 1 only) */
    int ctx_rotate;  /* the context's rotation (< 8 * width), or -1 for byte planes (format 1) */
} ckz_chunk_spec;

/* 0 if the spec is one of the above, else -1 with err set. */
int ckz_chunk_spec_check(const ckz_chunk_spec *spec, ckz_err *err);

/* Largest stream ckz_chunk_encode produces for a chunk of len bytes. */
size_t ckz_chunk_bound(size_t len, const ckz_chunk_spec *spec);

/* Codes the chunk src[0..len) against base[0..len) (NULL when the spec has neither residual
 * nor context) into out (ckz_chunk_bound bytes), or, out NULL, only sets *out_len to the exact
 * length of that stream.  len is a multiple of the width, <= CKZ_MAX_DECODED, and with a
 * context its element count <= CKZ_CTX_MAX_ELEMENTS (the caller checks).  Fails (-1, err set)
 * only when scratch memory runs out. */
int ckz_chunk_encode(const uint8_t *src, const uint8_t *base, size_t len,
                     const ckz_chunk_spec *spec, uint8_t *out, size_t *out_len, ckz_err *err);

/* Decodes a stream of ckz_chunk_encode into dst[0..len) given the same base[0..len) (NULL when
 * the spec has neither residual nor context); validates the stream as ckz_decode_planes and
 * ckz_decode_planes_ctx do.  dst must not overlap src or base. */
int ckz_chunk_decode(const uint8_t *src, size_t src_len, const uint8_t *base, uint8_t *dst,
                     size_t len, const ckz_chunk_spec *spec, ckz_err *err);

#endif /* CKZ_RESIDUAL_H */
