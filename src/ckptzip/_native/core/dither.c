#include "dither.h"

#include <math.h>

/* The "lowbias32" 32-bit mixer: xorshift-multiply, bijective. */
static inline uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

/* The indices from `index` on (at most `left` of them) that share its high 32 bits: how many,
 * with the first one's low 32 bits and their key for `seed`. */
static inline size_t key_run(uint64_t index, size_t left, uint32_t seed, uint32_t *key,
                             uint32_t *low) {
    uint32_t high = (uint32_t)(index >> 32);
    uint64_t room = (((uint64_t)high + 1) << 32) - index;
    *key = mix(mix(high) ^ seed);
    *low = (uint32_t)index;
    return left < room ? left : (size_t)room;
}

void ckz_dither_offsets(double *out, size_t count, uint64_t start, uint32_t seed) {
    size_t j = 0;
    while (j < count) {
        uint32_t key, low;
        size_t run = key_run(start + j, count - j, seed, &key, &low);
        for (size_t i = 0; i < run; i++) {
            uint32_t h = mix((low + (uint32_t)i) ^ key);
            /* exact: a 24-bit integer plus one half, over 2^24 */
            out[j + i] = ((double)(h >> 8) + 0.5) * (1.0 / 16777216.0) - 0.5;
        }
        j += run;
    }
}

/* The offset of one index for a seed's key (as ckz_dither_offsets computes it). */
static inline double offset_of(uint32_t low, uint32_t key) {
    uint32_t h = mix(low ^ key);
    return ((double)(h >> 8) + 0.5) * (1.0 / 16777216.0) - 0.5;
}

int ckz_dither_shift(const void *in, void *out, size_t elem_size, size_t count, uint32_t seed,
                     double step, int sign) {
    if ((elem_size != 4 && elem_size != 8) || (sign != 1 && sign != -1)) return -1;
    size_t j = 0;
    while (j < count) {
        uint32_t key, low;
        size_t run = key_run(j, count - j, seed, &key, &low);
        /* each element: x + (u * step) or x - (u * step) in double, as torch's ops compute
         * (tensor.double() +- offsets * step), rounded once to the output's type */
        if (elem_size == 4) {
            const float *x = (const float *)in + j;
            float *y = (float *)out + j;
            for (size_t i = 0; i < run; i++) {
                double shift = offset_of(low + (uint32_t)i, key) * step;
                y[i] = (float)(sign > 0 ? (double)x[i] + shift : (double)x[i] - shift);
            }
        } else {
            const double *x = (const double *)in + j;
            double *y = (double *)out + j;
            for (size_t i = 0; i < run; i++) {
                double shift = offset_of(low + (uint32_t)i, key) * step;
                y[i] = sign > 0 ? x[i] + shift : x[i] - shift;
            }
        }
        j += run;
    }
    return 0;
}

long ckz_round_levels(const void *x, size_t elem_size, size_t count, double step, uint32_t seed,
                      int dithered, int8_t *levels, uint64_t *counts) {
    if ((elem_size != 4 && elem_size != 8) || !(step > 0)) return -1;
    long top = 0;
    size_t j = 0;
    while (j < count) {
        uint32_t key, low;
        size_t run = key_run(j, count - j, seed, &key, &low);
        for (size_t i = 0; i < run; i++) {
            double value = elem_size == 4 ? (double)((const float *)x)[j + i]
                                          : ((const double *)x)[j + i];
            double u = offset_of(low + (uint32_t)i, key), level;
            if (dithered) {
                level = floor((value + u * step) / step + 0.5);
            } else {
                double scaled = value / step, below = floor(scaled);
                level = below + (u + 0.5 < scaled - below ? 1.0 : 0.0);
            }
            if (!(level >= -127 && level <= 127)) return -1; /* NaN too */
            long l = (long)level;
            levels[j + i] = (int8_t)l;
            counts[l + 127]++;
            top = l > top ? l : -l > top ? -l : top;
        }
        j += run;
    }
    return top;
}
