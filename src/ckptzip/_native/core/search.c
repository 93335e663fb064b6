#include "search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* floor(y) for |y| < 2^62 by a conversion (the baseline x86-64 has no rounding instruction:
 * floor() is a call per value there). */
static inline double floor_of(double y) {
    double t = (double)(int64_t)y;
    return t > y ? t - 1 : t;
}

/* Magnitudes at or above this many steps are whole multiples of it in double. */
#define WHOLE_STEPS 4503599627370496.0 /* 2^52 */

void ckz_rounding_spread(const float *x, size_t n, double step, double *mean, double *spread) {
    /* four accumulators each: the sums do not wait on one another */
    double m[4] = {0, 0, 0, 0}, s[4] = {0, 0, 0, 0}, inverse = 1 / step;
    size_t i = 0;
    for (; i < n; i += 4) {
        size_t lanes = n - i < 4 ? n - i : 4;
        for (size_t j = 0; j < lanes; j++) {
            double y = fabs((double)x[i + j]) * inverse;
            double f = y < WHOLE_STEPS ? y - (double)(int64_t)y : 0.0; /* NaN: 0 */
            double p = f * (1 - f), t = 1 - 2 * f;
            m[j] += p;
            s[j] += p * t * t;
        }
    }
    *mean = (m[0] + m[1]) + (m[2] + m[3]);
    *spread = (s[0] + s[1]) + (s[2] + s[3]);
}

double ckz_level_bits(const float *x, size_t n, double step, size_t limit) {
    if (!n) return 0.0;
    if (!(step > 0)) return -1.0;
    double inverse = 1 / step, low = INFINITY, high = -INFINITY;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double y = (double)x[i] * inverse;
        low = y < low ? y : low;
        high = y > high ? y : high;
        finite &= fabs(y) < WHOLE_STEPS; /* false for a NaN */
    }
    /* levels floor(low) .. floor(high) + 1 (a value may round up) */
    if (!finite || !(high - low + 3 <= (double)limit)) return -1.0;
    double first = floor_of(low);
    size_t bins = (size_t)(floor_of(high) - first) + 2;
    /* four histograms, one per element of each group of four: consecutive values mostly land
     * in the same few bins, and one histogram's adds would wait on one another */
    double *hist = calloc(4 * bins, sizeof *hist);
    if (!hist) return -1.0;
    for (size_t i = 0; i < n; i++) {
        double y = (double)x[i] * inverse, l = floor_of(y), f = y - l;
        double *h = hist + (i & 3) * bins + (size_t)(l - first);
        h[0] += 1 - f;
        h[1] += f;
    }
    double total = (double)n, bits = 0.0;
    for (size_t b = 0; b < bins; b++) {
        double count = (hist[b] + hist[bins + b]) + (hist[2 * bins + b] + hist[3 * bins + b]);
        if (count > 0) bits -= count * log2(count / total);
    }
    free(hist);
    return bits;
}

/* The number of values <= key in the ascending values (numpy's searchsorted, side "right"). */
static size_t upper_bound(const double *values, size_t n, double key) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (values[mid] <= key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* numpy's pairwise sum of n doubles (its add.reduce over a contiguous array): eight running
 * sums over blocks of at most 128, halves above. */
static double pairwise_sum(const double *a, size_t n) {
    if (n < 8) {
        double res = 0.;
        for (size_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        size_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t half = n / 2;
    half -= half % 8;
    return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* edges[0..m] of the clusters of m ascending centroids: 0, the values up to each midpoint, n. */
static void cluster_edges(const double *values, size_t n, const double *centroids, size_t m,
                          size_t *edges) {
    edges[0] = 0;
    for (size_t j = 1; j < m; j++)
        edges[j] = upper_bound(values, n, (centroids[j] + centroids[j - 1]) / 2);
    edges[m] = n;
}

long ckz_lloyd_sorted(const double *values, size_t n, unsigned k, unsigned iterations,
                      double *centroids, int64_t *counts, double *sse) {
    if (k < 1 || k > 255) return -1;
    *sse = 0.0;
    if (!n) return 0;
    double *sums = malloc((n + 1) * sizeof *sums), *squares = malloc((n + 1) * sizeof *squares);
    if (!sums || !squares) {
        free(sums);
        free(squares);
        return -1;
    }
    /* numpy's cumsum: one running sum, in order */
    sums[0] = squares[0] = 0.0;
    for (size_t i = 0; i < n; i++) {
        sums[i + 1] = sums[i] + values[i];
        squares[i + 1] = squares[i] + values[i] * values[i];
    }
    double c[2 * 255], means[255];
    size_t edges[256], m = 0;
    unsigned bulk = k - k / 2, spread = k / 2;
    for (unsigned i = 0; i < bulk; i++) {
        size_t pick = (size_t)(((double)i + 0.5) * (double)n / (double)bulk);
        c[m++] = values[pick < n - 1 ? pick : n - 1];
    }
    /* np.linspace(first, last, spread + 2)[1:-1]: i * step + first */
    double first = values[0], delta = values[n - 1] - values[0], step = delta / (spread + 1);
    for (unsigned i = 1; i <= spread; i++) c[m++] = step != 0 ? (double)i * step + first : first;
    qsort(c, m, sizeof *c, compare_doubles);
    size_t unique = 0;
    for (size_t j = 0; j < m; j++)
        if (!unique || c[j] != c[unique - 1]) c[unique++] = c[j];
    m = unique;
    for (unsigned it = 0; it < iterations; it++) {
        cluster_edges(values, n, c, m, edges);
        size_t kept = 0;
        for (size_t j = 0; j < m; j++) {
            size_t count = edges[j + 1] - edges[j];
            if (count) means[kept++] = (sums[edges[j + 1]] - sums[edges[j]]) / (double)count;
        }
        int same = kept == m;
        for (size_t j = 0; same && j < m; j++) same = means[j] == c[j];
        if (same) break;
        memcpy(c, means, kept * sizeof *c);
        m = kept;
    }
    cluster_edges(values, n, c, m, edges);
    double terms[255];
    for (size_t j = 0; j < m; j++) {
        size_t a = edges[j], b = edges[j + 1];
        double s1 = sums[b] - sums[a], s2 = squares[b] - squares[a];
        /* sum over a cluster of (x - c)^2 = s2 - 2 c s1 + n c^2, as numpy evaluates it */
        terms[j] = (s2 - 2 * c[j] * s1) + (double)(int64_t)(b - a) * c[j] * c[j];
        centroids[j] = c[j];
        counts[j] = (int64_t)(b - a);
    }
    double total = pairwise_sum(terms, m);
    *sse = total > 0.0 ? total : 0.0;
    free(sums);
    free(squares);
    return (long)m;
}

/* The number of values < key in the ascending values (numpy's searchsorted, side "left"). */
static size_t lower_bound(const double *values, size_t n, double key) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (values[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int ckz_uniform_candidate(const double *sorted, const double *sums, const double *squares,
                          size_t n, double step, double offset, long levels, double out[4]) {
    if (levels < 0 || levels > 127) return -1;
    size_t bins = 2 * (size_t)levels + 1, edges[256];
    double sse[255], counts[255];
    edges[0] = 0;
    for (long j = levels; j >= 1; j--) /* -(j - offset) step, ascending */
        edges[levels - j + 1] = lower_bound(sorted, n, -(((double)j - offset) * step));
    for (long j = 1; j <= levels; j++)
        edges[levels + j] = lower_bound(sorted, n, ((double)j - offset) * step);
    edges[bins] = n;
    size_t used = 0, nonzero = 0;
    for (size_t b = 0; b < bins; b++) {
        size_t count = edges[b + 1] - edges[b];
        double s1 = sums[edges[b + 1]] - sums[edges[b]];
        double s2 = squares[edges[b + 1]] - squares[edges[b]];
        sse[b] = b == (size_t)levels ? s2 : s2 - s1 * s1 / (double)(count ? count : 1);
        if (count) {
            counts[nonzero++] = (double)count;
            used += b != (size_t)levels;
        }
    }
    /* entropy_bits: -sum c log2(c / total) over the used bins, as numpy sums */
    double total = pairwise_sum(counts, nonzero), terms[255];
    for (size_t b = 0; b < nonzero; b++) terms[b] = counts[b] * log2(counts[b] / total);
    out[0] = (double)(edges[levels + 1] - edges[levels]);
    out[1] = (double)used;
    out[2] = nonzero && total > 0 ? -pairwise_sum(terms, nonzero) : 0.0;
    out[3] = pairwise_sum(sse, bins);
    return 0;
}

/* Float bits as unsigned keys in the floats' order: a non-negative float's with the sign bit
 * set, a negative one's all flipped (larger magnitudes sort lower); and back. */
static inline uint32_t key32(uint32_t u) { return u >> 31 ? ~u : u | 0x80000000u; }
static inline uint32_t bits32(uint32_t k) { return k >> 31 ? k & 0x7FFFFFFFu : ~k; }
static inline uint64_t key64(uint64_t u) { return u >> 63 ? ~u : u | (1ull << 63); }
static inline uint64_t bits64(uint64_t k) { return k >> 63 ? k & ~(1ull << 63) : ~k; }

/* LSD radix sort of n keys by RADIX_BITS-bit digits, skipping a digit every key shares;
 * ping-pongs between keys and scratch, the result back in keys. */
#define RADIX_BITS 11
#define RADIX (1u << RADIX_BITS)
#define DEFINE_RADIX_SORT(name, type, digits)                                                     \
    static int name(type *keys, size_t n) {                                                     \
        size_t(*counts)[RADIX] = calloc(digits, sizeof *counts);                                 \
        type *scratch = malloc(n * sizeof *scratch);                                             \
        if (!counts || !scratch) {                                                               \
            free(counts);                                                                        \
            free(scratch);                                                                       \
            return -1;                                                                           \
        }                                                                                        \
        for (size_t i = 0; i < n; i++)                                                           \
            for (unsigned d = 0; d < (digits); d++)                                              \
                counts[d][(keys[i] >> (d * RADIX_BITS)) & (RADIX - 1)]++;                        \
        type *from = keys, *to = scratch;                                                        \
        for (unsigned d = 0; d < (digits); d++) {                                                \
            size_t *count = counts[d], total = 0;                                                \
            if (count[(keys[0] >> (d * RADIX_BITS)) & (RADIX - 1)] == n) continue;               \
            for (unsigned b = 0; b < RADIX; b++) {                                               \
                size_t c = count[b];                                                             \
                count[b] = total;                                                                \
                total += c;                                                                      \
            }                                                                                    \
            for (size_t i = 0; i < n; i++)                                                       \
                to[count[(from[i] >> (d * RADIX_BITS)) & (RADIX - 1)]++] = from[i];              \
            type *t = from;                                                                      \
            from = to;                                                                           \
            to = t;                                                                              \
        }                                                                                        \
        if (from != keys) memcpy(keys, from, n * sizeof *keys);                                  \
        free(counts);                                                                            \
        free(scratch);                                                                           \
        return 0;                                                                                \
    }

DEFINE_RADIX_SORT(radix_sort32, uint32_t, 3)
DEFINE_RADIX_SORT(radix_sort64, uint64_t, 6)

int ckz_sort_floats(void *x, size_t n, size_t elem_size) {
    if (elem_size != 4 && elem_size != 8) return -1;
    int result;
    if (elem_size == 4) {
        uint32_t *u = x;
        for (size_t i = 0; i < n; i++)
            if ((u[i] & 0x7FFFFFFFu) > 0x7F800000u) return -1; /* a NaN: numpy puts them last */
        if (n < 2) return 0;
        for (size_t i = 0; i < n; i++) u[i] = key32(u[i]);
        result = radix_sort32(u, n);
        for (size_t i = 0; i < n; i++) u[i] = bits32(u[i]);
    } else {
        uint64_t *u = x;
        for (size_t i = 0; i < n; i++)
            if ((u[i] & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull) return -1;
        if (n < 2) return 0;
        for (size_t i = 0; i < n; i++) u[i] = key64(u[i]);
        result = radix_sort64(u, n);
        for (size_t i = 0; i < n; i++) u[i] = bits64(u[i]);
    }
    return result;
}

int ckz_descending_magnitudes(const double *ordered, size_t n, double *out) {
    for (size_t i = 0; i < n; i++)
        if (ordered[i] != ordered[i]) return -1;
    /* negatives: ordered[0 .. split), largest magnitude first; the rest: largest last */
    size_t split = lower_bound(ordered, n, 0.0), low = 0, high = n;
    for (size_t j = 0; j < n; j++) {
        double negative = low < split ? -ordered[low] : -1.0;
        double positive = high > split ? fabs(ordered[high - 1]) : -1.0;
        if (negative > positive) {
            out[j] = negative;
            low++;
        } else {
            out[j] = positive;
            high--;
        }
    }
    return 0;
}
