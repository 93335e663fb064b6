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

double ckz_step_bisect(const float *x, size_t n, double fraction, double sigmas, double target,
                       double fine, double coarse, double tolerance, unsigned rounds) {
    for (unsigned r = 0; r < rounds; r++) {
        if (coarse <= fine * (1 + tolerance)) break;
        double middle = sqrt(fine * coarse), mean, spread;
        ckz_rounding_spread(x, n, middle, &mean, &spread);
        /* modes/factoring.py _sample_step's error(step), its operations in its order */
        double error = mean * middle * middle + sigmas * sqrt(spread * fraction) * middle * middle;
        if (error <= target) fine = middle;
        else coarse = middle;
    }
    return fine;
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

/* Python's max(a, b) of two floats: a unless b is greater (a NaN first stays). */
static inline double py_max(double a, double b) { return b > a ? b : a; }

/* Python's round() of a float to an int: to nearest, ties to even (the default rounding mode's
 * nearbyint). */
static inline double py_round(double x) { return nearbyint(x); }

/* -(p log2 p + (1 - p) log2 (1 - p)), 0 at 0 and 1 (modes/quantize.py _binary_entropy). */
static double binary_entropy(double p) {
    if (p <= 0 || p >= 1) return 0.0;
    return -(p * log2(p) + (1 - p) * log2(1 - p));
}

/* entropy_bits of m cluster populations: -sum c log2(c / total) over the non-empty ones, summed
 * as numpy sums (pairwise). */
static double population_bits(const int64_t *counts, size_t m) {
    double kept[255], terms[255];
    size_t used = 0;
    for (size_t j = 0; j < m; j++)
        if (counts[j] > 0) kept[used++] = (double)counts[j];
    double total = pairwise_sum(kept, used);
    if (!(total != 0)) return 0.0;
    for (size_t j = 0; j < used; j++) terms[j] = kept[j] * log2(kept[j] / total);
    return -pairwise_sum(terms, used);
}

/* One uniform candidate of uniform_search; 0 when its levels overflow a uint8 code. */
static int uniform_try(const double *sample, const double *sums, const double *squares, size_t m,
                       double scale, double scale_sq, double top, double step, double offset,
                       ckz_choice *out) {
    double levels = floor(top / step + offset);
    if (!(2 * levels <= 255)) return 0; /* (a NaN too) */
    double got[4];
    if (ckz_uniform_candidate(sample, sums, squares, m, step, offset, (long)levels, got)) return 0;
    out->kept = py_round(((double)m - got[0]) * scale);
    out->k = got[1];
    out->bits = got[2] * scale;
    out->error = sqrt(py_max(got[3], 0.0) * scale / scale_sq);
    out->step = step;
    out->offset = offset;
    return 1;
}

/* modes/quantize.py _uniform: the cheapest uniform quantizer within budget, on a strided sample
 * of at most spec->samples of the n ascending values. 1 when one fits in 255 levels; -1 out of
 * memory. */
static int uniform_search(const double *ordered, size_t n, double scale_sq, double budget,
                          const ckz_search_spec *spec, ckz_choice *best) {
    size_t stride = n > spec->samples ? (n + spec->samples - 1) / spec->samples : 1;
    size_t m = n ? (n + stride - 1) / stride : 0;
    double *sample = malloc((m ? m : 1) * sizeof *sample);
    double *sums = malloc((m + 1) * sizeof *sums), *squares = malloc((m + 1) * sizeof *squares);
    if (!sample || !sums || !squares) {
        free(sample);
        free(sums);
        free(squares);
        return -1;
    }
    double top = 0.0;
    sums[0] = squares[0] = 0.0;
    for (size_t i = 0; i < m; i++) {
        double x = ordered[i * stride];
        sample[i] = x;
        /* numpy's cumsum: the first sum is the value itself */
        sums[i + 1] = i ? sums[i] + x : x;
        squares[i + 1] = i ? squares[i] + x * x : x * x;
        top = py_max(top, fabs(x));
    }
    double scale = (double)n / (double)(m ? m : 1);
    double rms = sqrt(squares[m] / (double)(m ? m : 1));
    int found = 0;
    if (rms > 0) {
        double coarsest = spec->coarsest * rms, finest = spec->finest * rms;
        for (size_t o = 0; o < spec->n_offsets; o++) {
            double offset = spec->offsets[o];
            ckz_choice choice, trial;
            int have = uniform_try(sample, sums, squares, m, scale, scale_sq, top, coarsest,
                                   offset, &choice);
            if (!have || choice.error > budget) {
                /* bisect, on a log scale, for the coarsest step that still fits */
                double coarse = coarsest, fine = finest;
                have = uniform_try(sample, sums, squares, m, scale, scale_sq, top, fine, offset,
                                   &trial) && trial.error <= budget;
                if (have) choice = trial;
                for (unsigned b = 0; b < spec->bisections; b++) {
                    double middle = sqrt(fine * coarse);
                    int tried = uniform_try(sample, sums, squares, m, scale, scale_sq, top, middle,
                                            offset, &trial);
                    if (tried && trial.error > budget) {
                        coarse = middle;
                    } else {
                        fine = middle;
                        if (tried) {
                            choice = trial;
                            have = 1;
                        }
                    }
                }
            }
            if (have && (!found || choice.bits < best->bits)) {
                *best = choice;
                found = 1;
            }
        }
    }
    free(sample);
    free(sums);
    free(squares);
    return found;
}

/* The first of the codebooks whose error fits the budget when the kept largest of n values
 * survive (modes/quantize.py _candidates); 0 when none fits, -1 out of memory.  Returns the
 * last codebook's candidate in *last whatever fits. */
static int kmeans_candidates(const double *ordered, const double *magnitudes, size_t n,
                             size_t kept, double pruned, double scale_sq, double budget,
                             const int64_t *codebooks, size_t n_codebooks,
                             const ckz_search_spec *spec, ckz_choice *out) {
    double threshold = magnitudes[kept - 1];
    /* the survivors are the two tails of the sorted values */
    size_t negative = upper_bound(ordered, n, -threshold), positive = lower_bound(ordered, n, threshold);
    size_t count = negative + n - positive;
    size_t step = count > spec->samples ? (count + spec->samples - 1) / spec->samples : 1;
    size_t low = (negative + step - 1) / step, high = (n - positive + step - 1) / step;
    size_t m = low + high;
    double *sample = malloc((m ? m : 1) * sizeof *sample);
    if (!sample) return -1;
    for (size_t i = 0; i < low; i++) sample[i] = ordered[i * step];
    for (size_t i = 0; i < high; i++) sample[low + i] = ordered[positive + i * step];
    double scale = (double)count / (double)m;
    double mask_bits = (double)n * binary_entropy((double)kept / (double)n);
    int fits = 0;
    for (size_t c = 0; c < n_codebooks; c++) {
        double centroids[255], sse;
        int64_t counts[255];
        long found = ckz_lloyd_sorted(sample, m, (unsigned)codebooks[c], spec->iterations,
                                      centroids, counts, &sse);
        if (found < 0) {
            free(sample);
            return -1;
        }
        out->kept = (double)kept;
        out->k = (double)codebooks[c];
        out->bits = mask_bits + population_bits(counts, (size_t)found) * scale;
        out->error = sqrt((pruned + sse * scale) / scale_sq);
        out->step = 0.0;
        out->offset = 0.5;
        if (out->error <= budget) { /* the first that fits: larger codebooks cost more */
            fits = 1;
            break;
        }
    }
    free(sample);
    return fits;
}

int ckz_quantize_search(const double *ordered, size_t n, double scale_sq, double budget,
                        int kmeans, const ckz_search_spec *spec, ckz_choice *out) {
    if (!spec->n_fractions || !spec->n_codebooks || !spec->samples || !spec->iterations ||
        !(spec->finest > 0 && spec->coarsest >= spec->finest && isfinite(spec->coarsest)) ||
        spec->bisections > 64 || n > ((size_t)1 << 52))
        return -3;
    for (size_t f = 0; f < spec->n_fractions; f++) /* a kept count at most n */
        if (!(spec->fractions[f] >= 0 && spec->fractions[f] <= 1)) return -3;
    for (size_t c = 0; c < spec->n_codebooks; c++)
        if (spec->codebooks[c] < 1 || spec->codebooks[c] > 255) return -3;
    for (size_t o = 0; o < spec->n_offsets; o++)
        if (!(spec->offsets[o] >= 0 && spec->offsets[o] < 1)) return -3;
    if (!(budget >= 0) || !(scale_sq > 0)) return -2;
    if (n && !(isfinite(ordered[0]) && isfinite(ordered[n - 1]))) return -2;
    ckz_choice best, choice;
    int found = 0, status;
    if (!kmeans) {
        status = uniform_search(ordered, n, scale_sq, budget, spec, out);
        if (status) return status < 0 ? -1 : 0;
    }
    double *magnitudes = malloc((n ? n : 1) * sizeof *magnitudes);
    double *energy = malloc((n + 1) * sizeof *energy);
    if (!magnitudes || !energy || ckz_descending_magnitudes(ordered, n, magnitudes)) {
        free(magnitudes);
        free(energy);
        return -1;
    }
    /* torch's cumsum of the squared magnitudes, after a zero: one running sum, in order */
    energy[0] = 0.0;
    for (size_t i = 0; i < n; i++) energy[i + 1] = i ? energy[i] + magnitudes[i] * magnitudes[i]
                                                     : magnitudes[i] * magnitudes[i];
    double total = energy[n];
    for (size_t f = 0; f < spec->n_fractions; f++) { /* largest first: the pruning error grows */
        size_t kept = (size_t)py_round(spec->fractions[f] * (double)n);
        double pruned = py_max(total - energy[kept], 0.0);
        if (sqrt(pruned / scale_sq) > budget) break;
        if (kept == 0) {
            choice = (ckz_choice){0, 1, 0.0, sqrt(total / scale_sq), 0.0, 0.5};
            status = choice.error <= budget;
        } else {
            status = kmeans_candidates(ordered, magnitudes, n, kept, pruned, scale_sq, budget,
                                       spec->codebooks, spec->n_codebooks, spec, &choice);
        }
        if (status < 0) goto oom;
        if (status && (!found || choice.bits < best.bits)) {
            best = choice;
            found = 1;
        }
    }
    status = uniform_search(ordered, n, scale_sq, budget, spec, &choice);
    if (status < 0) goto oom;
    if (status && (!found || choice.bits < best.bits)) {
        best = choice;
        found = 1;
    }
    if (!found) { /* nothing fits: the most accurate candidate */
        size_t kept = (size_t)py_round(spec->fractions[0] * (double)n);
        double pruned = py_max(total - energy[kept], 0.0);
        if (kept == 0) {
            best = (ckz_choice){0, 1, 0.0, sqrt(total / scale_sq), 0.0, 0.5};
        } else if (kmeans_candidates(ordered, magnitudes, n, kept, pruned, scale_sq, budget,
                                     spec->codebooks + spec->n_codebooks - 1, 1, spec, &best) < 0) {
            goto oom;
        }
    }
    free(magnitudes);
    free(energy);
    *out = best;
    return 0;
oom:
    free(magnitudes);
    free(energy);
    return -1;
}
