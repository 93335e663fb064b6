#include "masks.h"

void ckz_residual_add(const float *base, const float *delta, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) {
        const float b = base[i], d = delta[i];
        out[i] = d == 0.0f ? b : b + d;
    }
}

void ckz_keep_changed(const float *x, const uint8_t *mask, size_t n, float *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = (mask[i >> 3] >> (7 - (i & 7))) & 1u ? x[i] : 0.0f;
}
