#include "quantize.h"

#include <string.h>

#include <math.h>

#include "common.h"

/* Two ways to count the thresholds below each of a block of values, both free of branches on
 * the (unpredictable) comparisons:
 * - few thresholds (LINEAR_MOST): compare each value with every threshold, a loop
 *   over the block the compiler vectorizes (faster than the search below up to about 90
 *   thresholds for floats, with SSE2 as with AVX2; session 36's kernels.py);
 * - more: a binary search of 8 halvings over the thresholds padded with +inf to 256, the
 *   halvings of the block's values interleaved, so that their loads overlap.
 * Float values compare with float thresholds chosen so that the answer is the double one's:
 * for a double t and a float v, t < v exactly when v > t', t' the largest float below t where
 * t is not a float (no float lies between t' and t), t itself where it is. */
#define BLOCK 64
#define LINEAR_MOST 80

#define CODES(T, TABLE, V, RUN, OUT, COUNT, LINEAR)                                               \
    do {                                                                                          \
        uint32_t below_[BLOCK] = {0};                                                             \
        if ((COUNT) <= (LINEAR)) {                                                                \
            for (size_t k = 0; k < (COUNT); k++) {                                                \
                T t_ = (TABLE)[k];                                                                \
                for (size_t j = 0; j < BLOCK; j++) below_[j] += (uint32_t)(t_ < (V)[j]);          \
            }                                                                                     \
        } else {                                                                                  \
            for (uint32_t half = 128; half; half >>= 1)                                           \
                for (size_t j = 0; j < BLOCK; j++)                                                \
                    below_[j] += half & (0u - (uint32_t)((TABLE)[below_[j] + half - 1] < (V)[j])); \
            for (size_t j = 0; j < BLOCK; j++) below_[j] += (uint32_t)((TABLE)[below_[j]] < (V)[j]); \
        }                                                                                         \
        for (size_t j = 0; j < (RUN); j++)                                                        \
            (OUT)[j] = (uint8_t)((V)[j] == 0 ? 0 : 1 + below_[j]);                                \
    } while (0)

/* The largest float t' with t < v exactly when t' < v, for every float v (see above). */
static float float_threshold(double t) {
    float up = (float)t;
    if ((double)up < t) up = nextafterf(up, __builtin_inff());
    return (double)up == t ? up : nextafterf(up, -__builtin_inff());
}

CKZ_INLINE void nearest_codes_impl(const void *x, size_t elem_size, size_t n,
                                   const double *thresholds, size_t count, uint8_t *out) {
    if (elem_size == 4) {
        float table[256], values[BLOCK];
        for (size_t i = 0; i < 256; i++)
            table[i] = i < count ? float_threshold(thresholds[i]) : __builtin_inff();
        const float *f = (const float *)x;
        for (size_t i = 0; i < n; i += BLOCK) {
            size_t run = n - i < BLOCK ? n - i : BLOCK;
            for (size_t j = 0; j < BLOCK; j++) values[j] = f[i + (j < run ? j : 0)];
            CODES(float, table, values, run, out + i, count, LINEAR_MOST);
        }
    } else {
        double table[256], values[BLOCK];
        for (size_t i = 0; i < 256; i++) table[i] = i < count ? thresholds[i] : __builtin_inf();
        const double *d = (const double *)x;
        for (size_t i = 0; i < n; i += BLOCK) {
            size_t run = n - i < BLOCK ? n - i : BLOCK;
            for (size_t j = 0; j < BLOCK; j++) values[j] = d[i + (j < run ? j : 0)];
            CODES(double, table, values, run, out + i, count, LINEAR_MOST);
        }
    }
}
CKZ_VERSIONED(nearest_codes, (const void *x, size_t elem_size, size_t n, const double *thresholds,
                              size_t count, uint8_t *out),
              (x, elem_size, n, thresholds, count, out))

int ckz_nearest_codes(const void *x, size_t elem_size, size_t n, const double *thresholds,
                      size_t count, uint8_t *out) {
    if ((elem_size != 4 && elem_size != 8) || count >= CKZ_MAX_CENTROIDS) return -1;
    nearest_codes(x, elem_size, n, thresholds, count, out);
    return 0;
}

size_t ckz_table_lookup(const uint8_t *codes, size_t n, const double *table, size_t size,
                        size_t elem_size, void *out) {
    if (elem_size != 4 && elem_size != 8) return (size_t)-1;
    if (size > 256) size = 256;
    /* codes beyond the table read a zero and are found after the pass (no branch inside) */
    double wide[256];
    float narrow[256];
    for (size_t i = 0; i < 256; i++) {
        wide[i] = i < size ? table[i] : 0.0;
        narrow[i] = (float)wide[i];
    }
    unsigned top = 0;
    if (elem_size == 4) {
        float *o = (float *)out;
        for (size_t i = 0; i < n; i++) {
            o[i] = narrow[codes[i]];
            top |= codes[i] >= size;
        }
    } else {
        double *o = (double *)out;
        for (size_t i = 0; i < n; i++) {
            o[i] = wide[codes[i]];
            top |= codes[i] >= size;
        }
    }
    if (!top) return n;
    size_t first = 0;
    while (codes[first] < size) first++;
    return first;
}

/* uniform_bins works in blocks: a pass the compiler vectorizes computes a block's levels (the
 * magnitude's, as int32) and writes the pruned values, then a scalar pass sums the values of
 * the non-zero levels into their bins, in the elements' order. */
#define BIN_BLOCK 256

/* The magnitude level of each of n <= BIN_BLOCK values, pruned[i] (the value, or zero where its
 * level is zero), and whether every scaled magnitude is below limit + 1 (a NaN is not). */
CKZ_INLINE int block_bins_impl(const void *x, size_t elem_size, size_t n, double step,
                               double offset, unsigned limit, void *pruned, int32_t *level) {
    int inside = 1;
    const double bound = (double)limit + 1;
    for (size_t i = 0; i < n; i++) {
        const double v = elem_size == 4 ? (double)((const float *)x)[i] : ((const double *)x)[i];
        const double scaled = fabs(v) / step + offset;
        const int fits = scaled < bound;
        inside &= fits;
        /* with the offset >= 0 the callers pick, scaled >= 0 and the conversion is floor
         * (without a libm call); with another it truncates, as the scalar loop's did */
        level[i] = (int32_t)(fits ? scaled : 0.0);
        if (elem_size == 4) ((float *)pruned)[i] = level[i] ? (float)v : 0.0f;
        else ((double *)pruned)[i] = level[i] ? v : 0.0;
    }
    return inside;
}
CKZ_VERSIONED_RETURNING(int, block_bins, (const void *x, size_t elem_size, size_t n, double step,
                                          double offset, unsigned limit, void *pruned,
                                          int32_t *level),
                        (x, elem_size, n, step, offset, limit, pruned, level))

long ckz_uniform_bins(const void *x, size_t elem_size, size_t n, double step, double offset,
                      unsigned limit, void *pruned, double *sums, uint64_t *counts) {
    if ((elem_size != 4 && elem_size != 8) || !(step > 0) || limit > CKZ_MAX_UNIFORM_LEVEL)
        return -1;
    for (size_t b = 0; b < 2 * (size_t)limit + 1; b++) sums[b] = 0.0, counts[b] = 0;
    int32_t level[BIN_BLOCK];
    long top = 0;
    for (size_t start = 0; start < n; start += BIN_BLOCK) {
        const size_t run = n - start < BIN_BLOCK ? n - start : BIN_BLOCK;
        const char *block = (const char *)x + start * elem_size;
        if (!block_bins(block, elem_size, run, step, offset, limit,
                        (char *)pruned + start * elem_size, level))
            return -1; /* beyond the limit, or NaN */
        for (size_t i = 0; i < run; i++) {
            const long l = level[i];
            if (!l) continue; /* the zero bin, most values: nothing summed, nothing counted */
            const double v = elem_size == 4 ? (double)((const float *)block)[i]
                                            : ((const double *)block)[i];
            if (l > top) top = l;
            const size_t bin = (size_t)((v < 0 ? -l : l) + (long)limit);
            sums[bin] += v;
            counts[bin]++;
        }
    }
    return top;
}

/* Sums of squares with eight accumulators: independent chains the CPU overlaps, in a fixed
 * order (the result depends on n only, not on the machine or the CPU level: each accumulator's
 * additions are the same IEEE operations in a vector lane as alone). DIFF(j) is element j's
 * term. */
#define SUM_SQUARES(T, DIFF)                                                                     \
    do {                                                                                         \
        const T *p = (const T *)a, *q = (const T *)b;                                            \
        (void)q;                                                                                 \
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                \
        size_t i = 0;                                                                            \
        for (; i + 8 <= n; i += 8)                                                               \
            for (unsigned k = 0; k < 8; k++) {                                                   \
                double d = DIFF(i + k);                                                          \
                acc[k] += d * d;                                                                 \
            }                                                                                    \
        for (unsigned k = 0; i < n; i++, k++) {                                                  \
            double d = DIFF(i);                                                                  \
            acc[k] += d * d;                                                                     \
        }                                                                                        \
        total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])); \
    } while (0)
#define FLOAT_DIFF(j) ((double)(p[j] - q[j]))
#define FLOAT_VALUE(j) ((double)p[j])
#define DOUBLE_DIFF(j) (p[j] - q[j])
#define DOUBLE_VALUE(j) (p[j])

CKZ_INLINE double sum_squares_impl(const void *a, const void *b, size_t elem_size, size_t n) {
    double total = 0.0;
    if (elem_size == 4 && b)
        SUM_SQUARES(float, FLOAT_DIFF);
    else if (elem_size == 4)
        SUM_SQUARES(float, FLOAT_VALUE);
    else if (elem_size == 8 && b)
        SUM_SQUARES(double, DOUBLE_DIFF);
    else if (elem_size == 8)
        SUM_SQUARES(double, DOUBLE_VALUE);
    else
        return -1.0;
    return total;
}
CKZ_VERSIONED_RETURNING(double, sum_squares, (const void *a, const void *b, size_t elem_size,
                                              size_t n),
                        (a, b, elem_size, n))

double ckz_sum_squares(const void *a, const void *b, size_t elem_size, size_t n) {
    return sum_squares(a, b, elem_size, n);
}

size_t ckz_count_nonzero(const void *x, size_t elem_size, size_t n) {
    size_t count = 0;
    if (elem_size == 1) {
        const uint8_t *in = x;
        for (size_t i = 0; i < n; i++) count += in[i] != 0;
    } else if (elem_size == 4) {
        const float *in = x;
        for (size_t i = 0; i < n; i++) count += in[i] != 0.0f;
    } else if (elem_size == 8) {
        const double *in = x;
        for (size_t i = 0; i < n; i++) count += in[i] != 0.0;
    } else {
        return (size_t)-1;
    }
    return count;
}

/* floats_equal compares a block of EQUAL_BLOCK elements at a time in a loop the compiler
 * vectorizes (no exit inside it), and stops after the first block that differs: an update
 * changes a weight's first elements, so a changed weight costs one block. */
#define EQUAL_BLOCK 256
#define FLOATS_EQUAL(T)                                                                          \
    do {                                                                                         \
        const T *p = (const T *)a, *q = (const T *)b;                                            \
        for (size_t start = 0; start < n; start += EQUAL_BLOCK) {                                \
            const size_t end = n - start < EQUAL_BLOCK ? n : start + EQUAL_BLOCK;                \
            int same = 1;                                                                        \
            for (size_t i = start; i < end; i++) same &= p[i] == q[i];                           \
            if (!same) return 0;                                                                 \
        }                                                                                        \
        return 1;                                                                                \
    } while (0)

CKZ_INLINE int floats_equal_impl(const void *a, const void *b, size_t elem_size, size_t n) {
    if (elem_size == 4) FLOATS_EQUAL(float);
    if (elem_size == 8) FLOATS_EQUAL(double);
    return -1;
}
CKZ_VERSIONED_RETURNING(int, floats_equal, (const void *a, const void *b, size_t elem_size,
                                            size_t n),
                        (a, b, elem_size, n))

int ckz_floats_equal(const void *a, const void *b, size_t elem_size, size_t n) {
    return floats_equal(a, b, elem_size, n);
}

/* has_negative looks at a block of EQUAL_BLOCK elements at a time, as floats_equal does, and
 * stops after the first block that holds a negative value: a weight's first block holds one. */
#define HAS_NEGATIVE(T)                                                                          \
    do {                                                                                         \
        const T *p = (const T *)x;                                                               \
        for (size_t start = 0; start < n; start += EQUAL_BLOCK) {                                \
            const size_t end = n - start < EQUAL_BLOCK ? n : start + EQUAL_BLOCK;                \
            int negative = 0;                                                                    \
            for (size_t i = start; i < end; i++) negative |= p[i] < 0;                           \
            if (negative) return 1;                                                              \
        }                                                                                        \
        return 0;                                                                                \
    } while (0)

CKZ_INLINE int has_negative_impl(const void *x, size_t elem_size, size_t n) {
    if (elem_size == 4) HAS_NEGATIVE(float);
    if (elem_size == 8) HAS_NEGATIVE(double);
    return -1;
}
CKZ_VERSIONED_RETURNING(int, has_negative, (const void *x, size_t elem_size, size_t n),
                        (x, elem_size, n))

int ckz_has_negative(const void *x, size_t elem_size, size_t n) {
    return has_negative(x, elem_size, n);
}

/* The magnitude's bits of a float: sign cleared; above 0x7f800000 (infinity) a NaN. */
static inline uint32_t magnitude_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits & 0x7fffffffu;
}

/* The bin of hist (size bins) that holds the k-th smallest key, and k's rank within it. */
static size_t select_bin(const size_t *hist, size_t bins, size_t *k) {
    size_t bin = 0;
    while (bin + 1 < bins && *k >= hist[bin]) *k -= hist[bin++];
    return bin;
}

int ckz_kth_magnitude(const float *x, size_t n, size_t k, float *out) {
    if (k >= n) return -1;
    /* the 31 bits of a magnitude in three digits: bits 20..30 (11), 9..19 (11), 0..8 (9) */
    size_t hist[2048];
    memset(hist, 0, sizeof hist);
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = magnitude_bits(x[i]);
        nan |= bits > 0x7f800000u;
        hist[bits >> 20]++;
    }
    if (nan) return -1;
    uint32_t top = (uint32_t)select_bin(hist, 2048, &k);
    memset(hist, 0, sizeof hist);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = magnitude_bits(x[i]);
        if ((bits >> 20) == top) hist[(bits >> 9) & 0x7ffu]++;
    }
    uint32_t prefix = top << 11 | (uint32_t)select_bin(hist, 2048, &k);
    memset(hist, 0, 512 * sizeof hist[0]);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = magnitude_bits(x[i]);
        if ((bits >> 9) == prefix) hist[bits & 0x1ffu]++;
    }
    uint32_t bits = prefix << 9 | (uint32_t)select_bin(hist, 512, &k);
    memcpy(out, &bits, sizeof *out);
    return 0;
}

size_t ckz_compact_nonzero(const void *x, size_t elem_size, size_t n, void *out) {
    size_t kept = 0;
    if (elem_size == 4) {
        const float *in = x;
        float *to = out;
        for (size_t i = 0; i < n; i++) {
            to[kept] = in[i];  /* written always, counted where non-zero: no branch */
            kept += in[i] != 0.0f;
        }
    } else {
        const double *in = x;
        double *to = out;
        for (size_t i = 0; i < n; i++) {
            to[kept] = in[i];
            kept += in[i] != 0.0;
        }
    }
    return kept;
}

long ckz_mask_gather(const void *x, const uint8_t *mask, size_t elem_size, size_t n, void *out,
                     size_t capacity) {
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        int nonzero = elem_size == 4 ? ((const float *)x)[i] != 0.0f
                                     : ((const double *)x)[i] != 0.0;
        if (!mask[i]) {
            if (nonzero) return -1;
            continue;
        }
        if (kept == capacity) return -2;
        if (elem_size == 4)
            ((float *)out)[kept] = ((const float *)x)[i];
        else
            ((double *)out)[kept] = ((const double *)x)[i];
        kept++;
    }
    return (long)kept;
}

int ckz_mask_scatter(const void *values, size_t count, const uint8_t *mask, size_t elem_size,
                     size_t n, void *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (mask[i] && k == count) return -1;
        if (elem_size == 4)
            ((float *)out)[i] = mask[i] ? ((const float *)values)[k] : 0.0f;
        else
            ((double *)out)[i] = mask[i] ? ((const double *)values)[k] : 0.0;
        k += mask[i] != 0;
    }
    return k == count ? 0 : -1;
}

void ckz_spread_gather(const void *x, size_t n, size_t elem_size, uint64_t stride, void *out,
                       size_t count) {
    const char *in = x;
    char *to = out;
    uint64_t index = 0;
    for (size_t i = 0; i < count; i++) {
        memcpy(to + i * elem_size, in + index * elem_size, elem_size);
        index += stride; /* (i * stride) mod n, one addition at a time: stride < n */
        if (index >= n) index -= n;
    }
}
