#include "ratio.h"

#include <math.h>

#include "common.h"

/* The loops below are free of branches: every element's value is computed and the zero case
 * selected after, so that they vectorize (CKZ_VERSIONED_RETURNING).  A lane whose result is not
 * kept may divide by zero or take the root of a negative: its infinity or NaN is dropped by the
 * select, and the checks read only the kept lanes.  The sqrt calls are the correctly rounded
 * instruction (the build passes -fno-math-errno, so nothing else is called). */

/* A positive finite float: neither zero, negative, infinite nor NaN. */
#define POSITIVE_FINITE(s) (((s) > 0.0f) & ((s) < __builtin_inff()))
/* Zero or positive, finite. */
#define NONNEGATIVE_FINITE(s) (((s) >= 0.0f) & ((s) < __builtin_inff()))

CKZ_INLINE int base_ratios_impl(const float *x, const float *base, size_t n, double *out) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float v = x[i], b = base[i];
        const double quotient = (double)v / (double)b;
        bad |= (v != 0.0f) & !POSITIVE_FINITE(b);
        out[i] = v != 0.0f ? quotient : 0.0;
    }
    return bad;
}
CKZ_VERSIONED_RETURNING(int, base_ratios, (const float *x, const float *base, size_t n,
                                           double *out), (x, base, n, out))

int ckz_base_ratios(const float *x, const float *base, size_t n, double *out) {
    return base_ratios(x, base, n, out) ? -1 : 0;
}

CKZ_INLINE void ratio_restore_impl(const void *r, size_t elem_size, const float *base, size_t n,
                                   float *out) {
    if (elem_size == 4) {
        const float *ratio = r;
        for (size_t i = 0; i < n; i++) {
            const float restored = (float)((double)base[i] * (double)ratio[i]);
            out[i] = ratio[i] == 0.0f ? 0.0f : restored;
        }
    } else {
        const double *ratio = r;
        for (size_t i = 0; i < n; i++) {
            const float restored = (float)((double)base[i] * ratio[i]);
            out[i] = ratio[i] == 0.0 ? 0.0f : restored;
        }
    }
}
CKZ_VERSIONED(ratio_restore, (const void *r, size_t elem_size, const float *base, size_t n,
                              float *out), (r, elem_size, base, n, out))

int ckz_ratio_restore(const void *r, size_t elem_size, const float *base, size_t n, float *out) {
    if (elem_size != 4 && elem_size != 8) return -1;
    ratio_restore(r, elem_size, base, n, out);
    return 0;
}

CKZ_INLINE int step_quotients_impl(const float *x, const float *scale, size_t n, float *out) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float v = x[i], s = scale[i];
        const float quotient = (float)((double)v / sqrt((double)s));
        bad |= (v != 0.0f) & !POSITIVE_FINITE(s);
        out[i] = v != 0.0f ? quotient : 0.0f;
    }
    return bad;
}
CKZ_VERSIONED_RETURNING(int, step_quotients, (const float *x, const float *scale, size_t n,
                                              float *out), (x, scale, n, out))

int ckz_step_quotients(const float *x, const float *scale, size_t n, float *out) {
    return step_quotients(x, scale, n, out) ? -1 : 0;
}

CKZ_INLINE int step_restore_impl(const void *u, size_t elem_size, const float *scale, size_t n,
                                 float *out) {
    int bad = 0;
    if (elem_size == 4) {
        const float *step = u;
        for (size_t i = 0; i < n; i++) {
            const float s = scale[i];
            const float restored = (float)((double)step[i] * sqrt((double)s));
            bad |= (step[i] != 0.0f) & !NONNEGATIVE_FINITE(s);
            out[i] = step[i] == 0.0f ? 0.0f : restored;
        }
    } else {
        const double *step = u;
        for (size_t i = 0; i < n; i++) {
            const float s = scale[i];
            const float restored = (float)(step[i] * sqrt((double)s));
            bad |= (step[i] != 0.0) & !NONNEGATIVE_FINITE(s);
            out[i] = step[i] == 0.0 ? 0.0f : restored;
        }
    }
    return bad;
}
CKZ_VERSIONED_RETURNING(int, step_restore, (const void *u, size_t elem_size, const float *scale,
                                            size_t n, float *out), (u, elem_size, scale, n, out))

int ckz_step_restore(const void *u, size_t elem_size, const float *scale, size_t n, float *out) {
    if (elem_size != 4 && elem_size != 8) return -1;
    return step_restore(u, elem_size, scale, n, out) ? -2 : 0;
}

/* Element j's term: (restored - stored) / (stored * (sqrt(restored / stored) + 1)), each
 * operation correctly rounded to float (no contraction: -std=c11 leaves -ffp-contract off), 0
 * where the stored value is not positive (or NaN). */
CKZ_INLINE double sqrt_error_term(float x, float y) {
    const float difference = y - x;
    const float root = sqrtf(y / x);
    const float scale = x * (root + 1.0f);
    return x > 0.0f ? (double)(difference / scale) : 0.0;
}

CKZ_INLINE double sqrt_error_squares_impl(const float *x, const float *y, size_t n) {
    /* eight accumulators in ckz_sum_squares's order: the same total as summing the terms there */
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (unsigned k = 0; k < 8; k++) {
            const double d = sqrt_error_term(x[i + k], y[i + k]);
            acc[k] += d * d;
        }
    for (unsigned k = 0; i < n; i++, k++) {
        const double d = sqrt_error_term(x[i], y[i]);
        acc[k] += d * d;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
CKZ_VERSIONED_RETURNING(double, sqrt_error_squares, (const float *x, const float *y, size_t n),
                        (x, y, n))

double ckz_sqrt_error_squares(const float *x, const float *y, size_t n) {
    return sqrt_error_squares(x, y, n);
}
