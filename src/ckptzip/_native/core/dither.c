#include "dither.h"

#include <math.h>

#include "common.h"

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

/* The dither stage's pass over one run of indices that share their high 32 bits: element i
 * shifted by its offset times step, in double, rounded once to the element type. */
CKZ_INLINE void dither_run_impl(const void *in, void *out, size_t elem_size, size_t run,
                                uint32_t low, uint32_t key, double step, int sign) {
    /* each element: x + (u * step) or x - (u * step) in double, as torch's ops compute
     * (tensor.double() +- offsets * step), rounded once to the output's type */
    const double signed_step = sign > 0 ? step : -step; /* x - (u * step) == x + (u * -step) */
    if (elem_size == 4) {
        const float *x = (const float *)in;
        float *y = (float *)out;
        for (size_t i = 0; i < run; i++)
            y[i] = (float)((double)x[i] + offset_of(low + (uint32_t)i, key) * signed_step);
    } else {
        const double *x = (const double *)in;
        double *y = (double *)out;
        for (size_t i = 0; i < run; i++)
            y[i] = x[i] + offset_of(low + (uint32_t)i, key) * signed_step;
    }
}
CKZ_VERSIONED(dither_run, (const void *in, void *out, size_t elem_size, size_t run, uint32_t low,
                           uint32_t key, double step, int sign),
              (in, out, elem_size, run, low, key, step, sign))

int ckz_dither_shift(const void *in, void *out, size_t elem_size, size_t count, uint32_t seed,
                     double step, int sign) {
    if ((elem_size != 4 && elem_size != 8) || (sign != 1 && sign != -1)) return -1;
    size_t j = 0;
    while (j < count) {
        uint32_t key, low;
        size_t run = key_run(j, count - j, seed, &key, &low);
        dither_run((const char *)in + j * elem_size, (char *)out + j * elem_size, elem_size, run,
                   low, key, step, sign);
        j += run;
    }
    return 0;
}

/* round_levels works in blocks: a pass the compiler vectorizes computes and checks a block's
 * levels, then a scalar pass counts them, in four histograms by position (so that runs of one
 * level, most of them zero, do not wait on one counter). */
#define LEVEL_BLOCK 256

/* The level of each of `run` values (run <= LEVEL_BLOCK) of one key run starting at `low`, and
 * whether every one is within -127..127 (a NaN is not). */
CKZ_INLINE int block_levels_impl(const void *x, size_t elem_size, size_t run, double step,
                                 uint32_t low, uint32_t key, int dithered, double *level) {
    int inside = 1;
    for (size_t i = 0; i < run; i++) {
        const double value = elem_size == 4 ? (double)((const float *)x)[i]
                                            : ((const double *)x)[i];
        const double u = offset_of(low + (uint32_t)i, key);
        if (dithered) {
            level[i] = floor((value + u * step) / step + 0.5);
        } else {
            const double scaled = value / step, below = floor(scaled);
            level[i] = below + (u + 0.5 < scaled - below ? 1.0 : 0.0);
        }
        inside &= (level[i] >= -127) & (level[i] <= 127);
    }
    return inside;
}
CKZ_VERSIONED_RETURNING(int, block_levels, (const void *x, size_t elem_size, size_t run,
                                            double step, uint32_t low, uint32_t key, int dithered,
                                            double *level),
                        (x, elem_size, run, step, low, key, dithered, level))

/* Adds the four histograms into counts and clears them; top becomes the largest |level| seen. */
static void flush_levels(uint32_t hist[4][255], uint64_t *counts, long *top) {
    for (size_t b = 0; b < 255; b++) {
        const uint64_t here = (uint64_t)hist[0][b] + hist[1][b] + hist[2][b] + hist[3][b];
        const long magnitude = b >= 127 ? (long)b - 127 : 127 - (long)b;
        counts[b] += here;
        if (here && magnitude > *top) *top = magnitude;
        hist[0][b] = hist[1][b] = hist[2][b] = hist[3][b] = 0;
    }
}

long ckz_round_levels(const void *x, size_t elem_size, size_t count, double step, uint32_t seed,
                      int dithered, int8_t *levels, uint64_t *counts) {
    if ((elem_size != 4 && elem_size != 8) || !(step > 0)) return -1;
    uint32_t hist[4][255] = {{0}};
    double level[LEVEL_BLOCK];
    long top = 0;
    size_t j = 0, since_flush = 0;
    while (j < count) {
        uint32_t key, low;
        size_t run = key_run(j, count - j, seed, &key, &low);
        run = run < LEVEL_BLOCK ? run : LEVEL_BLOCK;
        if (!block_levels((const char *)x + j * elem_size, elem_size, run, step, low, key,
                          dithered, level))
            return -1;
        for (size_t i = 0; i < run; i++) {
            const int l = (int)level[i];
            levels[j + i] = (int8_t)l;
            hist[i & 3][l + 127]++;
        }
        j += run;
        since_flush += run;
        if (since_flush > UINT32_MAX - LEVEL_BLOCK) { /* before a count could overflow */
            flush_levels(hist, counts, &top);
            since_flush = 0;
        }
    }
    flush_levels(hist, counts, &top);
    return top;
}
