#include "sparse.h"

#include <math.h>
#include <string.h>

static uint32_t float_bits(float f) {
    uint32_t w;
    memcpy(&w, &f, 4);
    return w;
}

static float bits_float(uint32_t w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}

/* Rounding by the float unit itself: |f| scaled so that fp16's overflow becomes float's
 * infinity and its underflow lands where float's rounding of an added power of two (the one
 * that puts fp16's last mantissa bit at float's) is fp16's round to nearest even; the sum's
 * exponent and top mantissa bits are then the fp16 number's. */
uint16_t ckz_half_from_float(float f) {
    const float to_inf = 0x1.0p+112f, to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * to_inf) * to_zero;
    uint32_t w = float_bits(f), shl1 = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1 & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;  /* fp16's subnormals: a fixed power of two */
    base = bits_float((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = float_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (uint16_t)((sign >> 16) | (shl1 > 0xFF000000u ? 0x7E00u : nonsign));
}

float ckz_float_from_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    if (exponent == 0) {  /* zero or subnormal: mantissa * 2^-24, exact in float */
        float magnitude = (float)mantissa * 0x1.0p-24f;
        return bits_float(float_bits(magnitude) | sign);
    }
    if (exponent == 31) return bits_float(sign | 0x7F800000u | mantissa << 13);
    return bits_float(sign | (exponent + 112) << 23 | mantissa << 13);
}

size_t ckz_sparse_survey(const float *x, size_t n, double *max_abs) {
    size_t count = 0;
    float top = 0.0f;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        count += x[i] != 0.0f;
        nan |= a != a;
        top = a > top ? a : top;
    }
    *max_abs = nan ? (double)NAN : (double)top;
    return count;
}

size_t ckz_sparse_pack(const float *x, size_t n, int scale_exp, uint8_t *mask, uint8_t *lo,
                       uint8_t *hi, size_t capacity) {
    double scale = ldexp(1.0, -scale_exp);
    size_t k = 0;
    for (size_t start = 0; start < n; start += 8) {
        size_t run = n - start < 8 ? n - start : 8;
        unsigned byte = 0;
        for (size_t j = 0; j < run; j++) {
            float v = x[start + j];
            if (v == 0.0f) continue;
            if (k == capacity) return (size_t)-1;
            uint16_t h = ckz_half_from_float((float)((double)v * scale));
            lo[k] = (uint8_t)h, hi[k] = (uint8_t)(h >> 8), k++;
            byte |= 1u << j;
        }
        mask[start / 8] = (uint8_t)byte;
    }
    return k;
}

int ckz_sparse_unpack(const uint8_t *mask, const uint8_t *lo, const uint8_t *hi, size_t count,
                      size_t n, int scale_exp, float *out) {
    float scale = (float)ldexp(1.0, scale_exp);
    size_t bytes = (n + 7) / 8, k = 0;
    if (n % 8 && mask[bytes - 1] >> (n % 8)) return -1;  /* a bit beyond the tensor */
    for (size_t b = 0; b < bytes; b++) {
        unsigned byte = mask[b];
        size_t start = 8 * b, run = n - start < 8 ? n - start : 8;
        if (!byte) {
            memset(out + start, 0, run * sizeof(float));
            continue;
        }
        for (size_t j = 0; j < run; j++) {
            if (!(byte >> j & 1u)) {
                out[start + j] = 0.0f;
                continue;
            }
            if (k == count) return -1;
            out[start + j] = ckz_float_from_half((uint16_t)(lo[k] | hi[k] << 8)) * scale;
            k++;
        }
    }
    return k == count ? 0 : -1;
}
