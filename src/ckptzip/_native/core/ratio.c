#include "ratio.h"

#include <math.h>

int ckz_base_ratios(const float *x, const float *base, size_t n, double *out) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float b = base[i];
        const int usable = isfinite(b) && b > 0.0f;
        if (x[i] != 0.0f) {
            bad |= !usable;
            out[i] = (double)x[i] / (double)b;
        } else {
            out[i] = 0.0;
        }
    }
    return bad ? -1 : 0;
}

int ckz_ratio_restore(const void *r, size_t elem_size, const float *base, size_t n, float *out) {
    if (elem_size == 4) {
        const float *ratio = r;
        for (size_t i = 0; i < n; i++)
            out[i] = ratio[i] == 0.0f ? 0.0f : (float)((double)base[i] * (double)ratio[i]);
    } else if (elem_size == 8) {
        const double *ratio = r;
        for (size_t i = 0; i < n; i++)
            out[i] = ratio[i] == 0.0 ? 0.0f : (float)((double)base[i] * ratio[i]);
    } else {
        return -1;
    }
    return 0;
}

int ckz_step_quotients(const float *x, const float *scale, size_t n, float *out) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float s = scale[i];
        if (x[i] != 0.0f) {
            bad |= !(isfinite(s) && s > 0.0f);
            out[i] = (float)((double)x[i] / sqrt((double)s));
        } else {
            out[i] = 0.0f;
        }
    }
    return bad ? -1 : 0;
}

int ckz_step_restore(const void *u, size_t elem_size, const float *scale, size_t n, float *out) {
    int bad = 0;
    if (elem_size == 4) {
        const float *step = u;
        for (size_t i = 0; i < n; i++) {
            const float s = scale[i];
            if (step[i] == 0.0f) {
                out[i] = 0.0f;
            } else {
                bad |= !(isfinite(s) && s >= 0.0f);
                out[i] = (float)((double)step[i] * sqrt((double)s));
            }
        }
    } else if (elem_size == 8) {
        const double *step = u;
        for (size_t i = 0; i < n; i++) {
            const float s = scale[i];
            if (step[i] == 0.0) {
                out[i] = 0.0f;
            } else {
                bad |= !(isfinite(s) && s >= 0.0f);
                out[i] = (float)(step[i] * sqrt((double)s));
            }
        }
    } else {
        return -1;
    }
    return bad ? -2 : 0;
}

/* Element j's term: (restored - stored) / (stored * (sqrt(restored / stored) + 1)), each
 * operation correctly rounded to float (no contraction: -std=c11 leaves -ffp-contract off). */
static inline double sqrt_error_term(float x, float y) {
    if (!(x > 0.0f))
        return 0.0;
    const float difference = y - x;
    const float root = sqrtf(y / x);
    const float scale = x * (root + 1.0f);
    return (double)(difference / scale);
}

double ckz_sqrt_error_squares(const float *x, const float *y, size_t n) {
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
