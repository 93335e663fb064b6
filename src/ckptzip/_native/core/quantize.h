/* Element-wise passes of the lossy modes' quantizers: nearest-codebook codes, and the table
 * look-up that decodes them (the kmeans stage, docs/FORMAT.md). */
#ifndef CKZ_QUANTIZE_H
#define CKZ_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

/* Copies the non-zero values of x (n floats, elem_size 4, or doubles, 8; -0.0 is zero, a NaN is
 * not) to out in order and returns how many: the values a codebook is fitted to. */
size_t ckz_compact_nonzero(const void *x, size_t elem_size, size_t n, void *out);

/* How many of x's n elements of elem_size 1 (bytes, a bool mask), 4 (floats) or 8 (doubles)
 * are non-zero (-0.0 is zero, a NaN is not): torch.count_nonzero's count. (size_t)-1 for a bad
 * elem_size. */
size_t ckz_count_nonzero(const void *x, size_t elem_size, size_t n);

/* Whether a[i] == b[i] for each of n floats (elem_size 4) or doubles (8), as the floats compare
 * (-0.0 equals 0.0, a NaN equals nothing): torch's (a == b).all(), stopping at the first block
 * of 256 elements that differs. -1 for a bad elem_size. */
int ckz_floats_equal(const void *a, const void *b, size_t elem_size, size_t n);
/* 1 where a float (elem_size 4) or double (8) of x is below zero (-0.0 and NaN are not), else 0;
 * -1 for another elem_size. Stops at the first block that holds one. */
int ckz_has_negative(const void *x, size_t elem_size, size_t n);

/* The k-th smallest (from 0, k < n) of the magnitudes |x[i]| of n floats, into *out: the value of
 * torch's x.abs().kthvalue(k + 1), and its median() at k = (n - 1) / 2. A radix selection over
 * the magnitudes' bits (those of non-negative floats order as the floats do), three passes,
 * no copy. Returns 0; -1 where k >= n or x holds a NaN (*out is then not set). */
int ckz_kth_magnitude(const float *x, size_t n, size_t k, float *out);

/* The values of x (n floats, elem_size 4, or doubles, 8) where mask[i] is non-zero, in order,
 * to out (capacity values): the support stage's encoding. Returns how many; -1 where x is
 * non-zero (-0.0 is zero, a NaN is not) outside the mask, -2 where the mask marks more than
 * capacity. */
long ckz_mask_gather(const void *x, const uint8_t *mask, size_t elem_size, size_t n, void *out,
                     size_t capacity);

/* out[i] = x[(i * stride) mod n] for i < count, elements of elem_size bytes (stride < n): the
 * spread sample of codecs/kmeans.py. */
void ckz_spread_gather(const void *x, size_t n, size_t elem_size, uint64_t stride, void *out,
                       size_t count);

/* The inverse: out[i] (n values) = the k-th of values at the k-th element mask marks, +0.0
 * elsewhere. Returns 0; -1 where the mask does not mark exactly count elements (out is then
 * meaningless; values is never read beyond count). */
int ckz_mask_scatter(const void *values, size_t count, const uint8_t *mask, size_t elem_size,
                     size_t n, void *out);

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

/* The sum over n floats (elem_size 4) or doubles (8) of a[i]^2, or with b of (a[i] - b[i])^2,
 * the difference taken in the element type (exact for values within a factor of two of each
 * other) and squared and summed in double, in an order fixed by n. -1 for a bad elem_size. */
double ckz_sum_squares(const void *a, const void *b, size_t elem_size, size_t n);

/* The most levels either side of zero ckz_uniform_bins counts. */
#define CKZ_MAX_UNIFORM_LEVEL 4095

/* The uniform quantizer of the lossy modes' search, over n floats (elem_size 4) or doubles (8):
 * level = sign(x) * floor(|x| / step + offset), in double. For each level l in -limit..limit
 * but 0, sums[l + limit] and counts[l + limit] get the sum and the number of the values at it
 * (arrays of 2 limit + 1; level 0's, which decodes to zero, stay 0), and pruned[i] = x[i], or
 * zero at level 0. Returns the largest |level|, or -1 for
 * a level beyond `limit` (or a NaN), a step not > 0, a bad elem_size or a limit above
 * CKZ_MAX_UNIFORM_LEVEL (then nothing is meaningful). */
long ckz_uniform_bins(const void *x, size_t elem_size, size_t n, double step, double offset,
                      unsigned limit, void *pruned, double *sums, uint64_t *counts);

#endif
