/* Seeded dither offsets (the dither and mark stages of the adaptive mode; docs/FORMAT.md). */
#ifndef CKZ_DITHER_H
#define CKZ_DITHER_H

#include <stddef.h>
#include <stdint.h>

/* out[j] = the offset of element start + j for seed: ((h >> 8) + 1/2) / 2^24 - 1/2, with
 * h = mix(lo ^ mix(mix(hi) ^ seed)) of the index's low and high 32 bits. */
void ckz_dither_offsets(double *out, size_t count, uint64_t start, uint32_t seed);

/* out[i] = in[i] + sign * (offset of element i for seed) * step, for count floats (elem_size 4)
 * or doubles (8), in double arithmetic rounded once to the element type: the dither stage's
 * encode (sign 1) and decode (sign -1) of a whole tensor in one pass. in may be out. Returns 0,
 * or -1 for a bad elem_size or sign. */
int ckz_dither_shift(const void *in, void *out, size_t elem_size, size_t count, uint32_t seed,
                     double step, int sign);

/* The adaptive mode's unbiased rounding of count floats (elem_size 4) or doubles (8) to
 * multiples of step > 0, in double arithmetic op for op as modes/factoring.py's torch code:
 * dithered (nonzero), level = floor((x + u * step) / step + 1/2) with u element i's offset for
 * seed (the dither stage's); else stochastically, level = floor(x / step) + (u + 1/2 < x / step -
 * floor(x / step)), u the offset for seed (the caller's key applied).  Writes each level as an
 * int8 and counts[level + 127] (255 counts, added to).  Returns the largest |level|, or -1 at the
 * first level beyond 127 or a NaN (then the levels and counts are meaningless), or for a bad
 * elem_size or step. */
long ckz_round_levels(const void *x, size_t elem_size, size_t count, double step, uint32_t seed,
                      int dithered, int8_t *levels, uint64_t *counts);

#endif
