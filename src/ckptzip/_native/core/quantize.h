/* Element-wise passes of the lossy modes' quantizers: nearest-codebook codes, and the table
 * look-up that decodes them (the kmeans stage, docs/FORMAT.md). */
#ifndef CKZ_QUANTIZE_H
#define CKZ_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

/* The largest codebook a uint8 code addresses (code 0 is zero). */
#define CKZ_MAX_CENTROIDS 255

/* out[i] = 0 where x[i] == 0 (either sign), else 1 + the number of thresholds below x[i]
 * (strictly), for n values of elem_size 4 (float) or 8 (double) bytes and `count` ascending
 * double thresholds (count < CKZ_MAX_CENTROIDS): the nearest of a sorted codebook, given the
 * midpoints between its entries (a NaN gets code 1). Returns 0, or -1 for a bad elem_size or
 * count. */
int ckz_nearest_codes(const void *x, size_t elem_size, size_t n, const double *thresholds,
                      size_t count, uint8_t *out);

/* out[i] = table[codes[i]] for n codes, as floats (elem_size 4) or doubles (8); the table has
 * `size` entries. Returns n, or the index of the first code at or beyond `size` (out is then
 * meaningless), or (size_t)-1 for a bad elem_size. */
size_t ckz_table_lookup(const uint8_t *codes, size_t n, const double *table, size_t size,
                        size_t elem_size, void *out);

#endif
