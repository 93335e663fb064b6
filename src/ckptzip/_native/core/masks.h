/* Element-wise passes of the lossy stages that decode against the base or a change mask (the
 * lossy-residual and zeros stages, docs/FORMAT.md), in float32, each operation IEEE's: the same
 * bits as torch's float32 ops on any host. */
#ifndef CKZ_MASKS_H
#define CKZ_MASKS_H

#include <stddef.h>
#include <stdint.h>

/* out[i] = base[i] where delta[i] is zero (either sign: the base's own bits, -0.0 included),
 * else base[i] + delta[i] rounded to float. out may be base or delta. */
void ckz_residual_add(const float *base, const float *delta, size_t n, float *out);

/* out[i] = x[i] where element i is marked in mask (the most significant bit of byte k marks
 * element 8 k, its least significant 8 k + 7: the zeros stage's order), else +0.0.
 * The mask holds (n + 7) / 8 bytes. out may be x. */
void ckz_keep_changed(const float *x, const uint8_t *mask, size_t n, float *out);

#endif
