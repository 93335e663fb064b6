/* The sparse stage's element-wise passes (docs/FORMAT.md, "sparse"): a float32 tensor whose
 * dropped elements are zero, as a bitmask of the kept elements plus their values as fp16 numbers
 * times a power of two, split into a low-byte and a high-byte plane. Bit j of mask byte i marks
 * element 8 i + j. The arithmetic is torch's, so that the native passes and the torch ones (on a
 * device) write and read the same bytes: a value is scaled in double, rounded to float, then to
 * fp16 (round to nearest, ties to even); a decoded fp16 number is widened to float and
 * multiplied by the scale rounded to float. */
#ifndef CKZ_SPARSE_H
#define CKZ_SPARSE_H

#include <stddef.h>
#include <stdint.h>

/* The number of non-zero elements of x[0..n) (-0.0 counts as zero, a NaN as non-zero), and in
 * *max_abs the largest magnitude among them (NaN where one is NaN, 0 where there are none). */
size_t ckz_sparse_survey(const float *x, size_t n, double *max_abs);

/* Writes mask[0 .. (n + 7) / 8), with the unused bits of its last byte zero, and for the k-th
 * non-zero element v of x, lo[k] and hi[k]: the low and high bytes of fp16((float)(v * 2^-scale_exp)).
 * Returns the number of non-zeros, or (size_t)-1 where there are more than `capacity` (lo and hi
 * hold `capacity` bytes each; nothing is written beyond them). */
size_t ckz_sparse_pack(const float *x, size_t n, int scale_exp, uint8_t *mask, uint8_t *lo,
                       uint8_t *hi, size_t capacity);

/* The inverse: out[0..n) gets +0.0 where the mask bit is clear, and at the k-th set bit
 * float(fp16 hi[k]:lo[k]) * (float)2^scale_exp. Returns 0, or -1 where the mask does not mark
 * exactly `count` of the n elements (a set bit beyond n included); out is then meaningless. */
int ckz_sparse_unpack(const uint8_t *mask, const uint8_t *lo, const uint8_t *hi, size_t count,
                      size_t n, int scale_exp, float *out);

/* fp16 bits of a float, rounded to nearest, ties to even (a NaN becomes sign | 0x7E00), and the
 * float of fp16 bits (exact). */
uint16_t ckz_half_from_float(float f);
float ckz_float_from_half(uint16_t h);

#endif
