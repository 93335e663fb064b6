/* Seeded dither offsets (the dither and mark stages of the adaptive mode; docs/FORMAT.md). */
#ifndef CKZ_DITHER_H
#define CKZ_DITHER_H

#include <stddef.h>
#include <stdint.h>

/* out[j] = the offset of element start + j for seed: ((h >> 8) + 1/2) / 2^24 - 1/2, with
 * h = mix(lo ^ mix(mix(hi) ^ seed)) of the index's low and high 32 bits. */
void ckz_dither_offsets(double *out, size_t count, uint64_t start, uint32_t seed);

#endif
