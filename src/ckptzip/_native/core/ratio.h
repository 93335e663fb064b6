/* The element-wise passes of Adam's second moments coded against the base (the base-ratio stage,
 * docs/FORMAT.md) and of the error the adaptive mode checks them by. Each operation is IEEE's,
 * correctly rounded, in the precision torch computes it in (float64 for the stage, whose
 * decoding must give the same bits on every device; float32 for the error), so the results are
 * the same on every host. */
#ifndef CKZ_RATIO_H
#define CKZ_RATIO_H

#include <stddef.h>

/* out[i] = (double)x[i] / (double)base[i] where x[i] is non-zero (either sign of zero is zero), 0
 * where it is zero. Returns 0, or -1 where a non-zero x[i] has a base that is zero, negative or
 * not finite (no ratio; out is then meaningless). */
int ckz_base_ratios(const float *x, const float *base, size_t n, double *out);

/* The inverse: out[i] = (float)((double)base[i] * (double)r[i]), and +0.0 where r[i] is zero,
 * for n ratios of elem_size 4 (float) or 8 (double). Returns 0, or -1 for a bad elem_size. */
int ckz_ratio_restore(const void *r, size_t elem_size, const float *base, size_t n, float *out);

/* Adam's step for the sqrt-scale stage: out[i] = (float)((double)x[i] / sqrt((double)scale[i]))
 * where x[i] is non-zero (the quotient in double, rounded once), 0 where it is zero. Returns 0,
 * or -1 where a non-zero x[i] has a scale that is zero, negative or not finite (no step; out is
 * then meaningless). */
int ckz_step_quotients(const float *x, const float *scale, size_t n, float *out);

/* The inverse: out[i] = (float)((double)u[i] * sqrt((double)scale[i])), and +0.0 where u[i] is
 * zero, for n steps of elem_size 4 (float) or 8 (double). Returns 0, -1 for a bad elem_size, or
 * -2 where a non-zero u[i] has a scale that is negative or not finite (damage). */
int ckz_step_restore(const void *u, size_t elem_size, const float *scale, size_t n, float *out);

/* The sum of squares of sqrt(y / x) - 1, computed as (y - x) / (x (sqrt(y / x) + 1)) in float
 * (float32 keeps its relative precision however small v is), over the n elements where x is
 * positive (0 elsewhere), summed in double in the order ckz_sum_squares sums. The float square
 * root is correctly rounded (torch's on AVX-512 hosts can be an ulp off). */
double ckz_sqrt_error_squares(const float *x, const float *y, size_t n);

#endif
