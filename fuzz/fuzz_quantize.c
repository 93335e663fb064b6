/* fuzz_quantize.c - libFuzzer harness for the lossy stages' element-wise passes (quantize.h,
 * dither.h): the code look-up a reader runs on a file's codes and codebook, and the passes a
 * writer runs on a tensor's values, on whatever bytes the fuzzer gives.
 *
 * Input: control byte | 2 bytes: the thresholds' count T (mod 255) | rest: data.  Control bits
 * 0-1 pick the element size (float or double, bit 0), bits 2-7 a step's exponent.  Checked:
 * - table_lookup decodes codes below the table's size and names the first code beyond it;
 * - nearest_codes gives 0 exactly at zeros, codes in 1..T+1 elsewhere, monotone in the value;
 * - uniform_bins' counts add up to the values off the zero level, its pruned values are the
 *   originals or zero, and
 *   it refuses levels beyond its limit rather than writing past its bins;
 * - dither_shift by a step and back restores the values within a rounding each way, in place;
 * - sum_squares is finite and >= 0 on finite input;
 * - round_levels' int8 levels lie within a step and a half of their values and are counted once;
 * - lloyd_sorted's populations add up; level_bits and rounding_spread are never negative;
 * - compact_nonzero keeps exactly the non-zeros, in order;
 * - sparse_unpack, on a mask and value planes taken from the data, accepts exactly the masks
 *   that mark `count` of the n elements, and what it decodes packs back to no more values, each
 *   at a marked element;
 * - base_ratios (ratio.h) refuses exactly the non-zero values over a base that is zero,
 *   negative or not finite, gives 0 at zeros, and ratio_restore gives the value back within
 *   two float roundings where it is normal; sqrt_error_squares is never negative;
 * - the later stages' decode passes, on the data's floats (check_later_stages, session 38):
 *   residual_add gives the base's bits where the difference is zero (either sign) and the float
 *   sum elsewhere, in place on either input as well; keep_changed keeps exactly the marked
 *   elements (the most significant bit first) and +0.0 elsewhere, in place too; step_quotients
 *   refuses exactly the non-zero values over a scale that is zero, negative or not finite, and
 *   step_restore gives the value back within two float roundings where it is normal, refuses a
 *   bad element size and a non-zero step over a negative scale; mask_scatter accepts exactly the
 *   masks that mark `count` elements and puts the values there, in order, and mask_gather takes
 *   them back; floats_equal and count_nonzero agree with the element-by-element answer (and
 *   refuse a bad element size); kth_magnitude gives the k-th smallest magnitude of a copy
 *   sorted here, or refuses a NaN or k beyond n.
 * Any outcome but a crash or a sanitizer report is fine otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "dither.h"
#include "masks.h"
#include "quantize.h"
#include "ratio.h"
#include "search.h"
#include "sparse.h"

#define LIMIT 63

static double finite_or_zero(double v) { return isfinite(v) ? v : 0.0; }

static int ascending(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int ascending_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int same_float(float a, float b) {
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

/* The decode passes of the stages added after session 16 (masks.h, ratio.h's steps, quantize.h's
 * support scatter and checks), on the data read as n floats: x the data, y the same data one
 * float on, the mask its first bytes. */
static void check_later_stages(const uint8_t *data, size_t size, unsigned control) {
    size_t n = size / 4 > 1 ? size / 4 - 1 : 0;
    float *x = malloc(n * 4 + 8), *y = malloc(n * 4 + 8), *out = malloc(n * 4 + 8);
    float *again = malloc(n * 4 + 8);
    memcpy(x, data, n * 4);
    memcpy(y, data + 4, n * 4);

    /* lossy residual: the base y plus the difference x */
    ckz_residual_add(y, x, n, out);
    for (size_t i = 0; i < n; i++) {
        float expected = x[i] == 0.0f ? y[i] : y[i] + x[i];
        if (!same_float(out[i], expected)) abort();
    }
    memcpy(again, x, n * 4);
    ckz_residual_add(y, again, n, again);  /* into the difference's memory */
    if (memcmp(again, out, n * 4)) abort();
    memcpy(again, y, n * 4);
    ckz_residual_add(again, x, n, again);  /* into the base's memory */
    if (memcmp(again, out, n * 4)) abort();

    /* zeros: a change mask over x, the data's bytes from the start */
    ckz_keep_changed(x, data, n, out);
    for (size_t i = 0; i < n; i++) {
        int marked = data[i / 8] >> (7 - i % 8) & 1u;
        float expected = marked ? x[i] : 0.0f;
        if (memcmp(&out[i], &expected, sizeof expected)) abort();
    }
    memcpy(again, x, n * 4);
    ckz_keep_changed(again, data, n, again);
    if (memcmp(again, out, n * 4)) abort();

    /* the step coding: x over sqrt(y), and back */
    int has_steps = ckz_step_quotients(x, y, n, out) == 0, usable = 1;
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f && !(isfinite(y[i]) && y[i] > 0.0f)) usable = 0;
    if (has_steps != usable) abort();
    if (has_steps) {
        if (ckz_step_restore(out, 4, y, n, again)) abort();
        for (size_t i = 0; i < n; i++) {
            if (x[i] == 0.0f) {
                if (out[i] != 0.0f || again[i] != 0.0f) abort();
            } else if (isnormal(x[i]) && isnormal(out[i]) && isnormal(again[i])
                       && fabsf(again[i] - x[i]) > fabsf(x[i]) * 0x1p-22f) {
                abort();
            }
        }
    }
    if (ckz_step_restore(x, 3, y, n, again) != -1) abort();
    int damaged = 0;
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f && !(isfinite(y[i]) && y[i] >= 0.0f)) damaged = 1;
    int restored = ckz_step_restore(x, 4, y, n, again);
    if ((restored == -2) != damaged || (restored != 0 && restored != -2)) abort();

    /* the support stage: values scattered at a mask's marked elements (a byte each), and back */
    size_t marked = 0;
    for (size_t i = 0; i < n; i++) marked += data[i] != 0;
    size_t count = marked + (control >> 1 & 1);  /* one more than marked, sometimes */
    if (count > n) count = n;
    int scattered = ckz_mask_scatter(y, count, data, 4, n, out);
    if ((scattered == 0) != (count == marked)) abort();
    if (scattered == 0) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            float expected = data[i] ? y[k++] : 0.0f;
            if (memcmp(&out[i], &expected, sizeof expected)) abort();
        }
        /* gathered back: the same values, unless a marked value is zero where the mask
         * says so (a gather refuses only non-zeros outside the mask) */
        long gathered = ckz_mask_gather(out, data, 4, n, again, n);
        if (gathered != (long)count || memcmp(again, y, count * 4)) abort();
    }

    /* the checks: floats_equal and count_nonzero against the element-by-element answer */
    int equal = 1;
    size_t nonzero = 0, bytes_nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(x[i] == y[i])) equal = 0;
        nonzero += x[i] != 0.0f;
    }
    for (size_t i = 0; i < size; i++) bytes_nonzero += data[i] != 0;
    int self = 1;  /* x equals itself unless it holds a NaN */
    for (size_t i = 0; i < n; i++) self &= x[i] == x[i];
    if (ckz_floats_equal(x, y, 4, n) != equal || ckz_floats_equal(x, x, 4, n) != self) abort();
    if (ckz_floats_equal(x, y, 3, n) != -1) abort();
    if (ckz_count_nonzero(x, 4, n) != nonzero || ckz_count_nonzero(data, 1, size) != bytes_nonzero)
        abort();
    if (ckz_count_nonzero(x, 3, n) != (size_t)-1) abort();

    /* the k-th magnitude: against a sorted copy of the magnitudes */
    int has_nan = 0;
    for (size_t i = 0; i < n; i++) {
        again[i] = fabsf(x[i]);
        has_nan |= isnan(x[i]);
    }
    size_t k = n ? (size_t)(data[0] | data[1] << 8) % (n + 1) : 0;  /* k == n sometimes */
    float kth = -1.0f;
    int selected = ckz_kth_magnitude(x, n, k, &kth);
    if ((selected == 0) != (k < n && !has_nan)) abort();
    if (selected == 0) {
        qsort(again, n, sizeof(float), ascending_float);
        if (memcmp(&kth, &again[k], sizeof kth)) abort();
    }
    free(x), free(y), free(out), free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    unsigned control = data[0];
    size_t count = (size_t)(data[1] | data[2] << 8) % CKZ_MAX_CENTROIDS;
    data += 3, size -= 3;
    size_t elem = (control & 1) ? 8 : 4;
    double step = ldexp(1.0, (int)(control >> 2) - 40);

    /* the reader's look-up: codes are the data's bytes, the table the first entries */
    size_t table_size = 1 + count % 256;
    double table[256];
    for (size_t i = 0; i < table_size; i++) table[i] = (double)i - 7.5;
    double *out = malloc(size * 8 + 8);
    size_t done = ckz_table_lookup(data, size, table, table_size, elem, out);
    size_t first_bad = 0;
    while (first_bad < size && data[first_bad] < table_size) first_bad++;
    if (done != first_bad) abort();
    for (size_t i = 0; i < done; i++) {
        double got = elem == 4 ? (double)((float *)out)[i] : out[i];
        if (got != table[data[i]]) abort();
    }

    /* the writer's passes on the data as values */
    size_t n = size / elem;
    void *values = malloc(n * elem + 8);
    memcpy(values, data, n * elem);
    for (size_t i = 0; i < n; i++) {
        if (elem == 4) {
            float *f = (float *)values;
            f[i] = (float)finite_or_zero(f[i]);
        } else {
            double *d = (double *)values;
            d[i] = finite_or_zero(d[i]);
        }
    }
    double *thresholds = malloc((count + 1) * sizeof(double));
    for (size_t k = 0; k < count; k++)
        thresholds[k] = ((double)k - (double)count / 2) * step;
    qsort(thresholds, count, sizeof(double), ascending);
    uint8_t *codes = malloc(n + 1);
    if (ckz_nearest_codes(values, elem, n, thresholds, count, codes)) abort();
    for (size_t i = 0; i < n; i++) {
        double v = elem == 4 ? (double)((float *)values)[i] : ((double *)values)[i];
        if ((v == 0.0) != (codes[i] == 0) || codes[i] > count + 1) abort();
        size_t below = 0;
        while (below < count && thresholds[below] < v) below++;
        if (v != 0.0 && codes[i] != 1 + below) abort();
    }

    double sums[2 * LIMIT + 1];
    uint64_t counts[2 * LIMIT + 1];
    void *pruned = malloc(n * elem + 8);
    long top = ckz_uniform_bins(values, elem, n, step, 0.5, LIMIT, pruned, sums, counts);
    if (top > LIMIT) abort();
    if (top >= 0) {
        /* every value off the zero level is counted once; the zero level is not */
        uint64_t total = 0, off_zero = 0;
        for (size_t b = 0; b < 2 * LIMIT + 1; b++) total += counts[b];
        if (counts[LIMIT] || sums[LIMIT] != 0.0) abort();
        for (size_t i = 0; i < n; i++) {
            double v = elem == 4 ? (double)((float *)values)[i] : ((double *)values)[i];
            double p = elem == 4 ? (double)((float *)pruned)[i] : ((double *)pruned)[i];
            if (p != v && p != 0.0) abort();
            off_zero += floor(fabs(v) / step + 0.5) >= 1;
        }
        if (total != off_zero) abort();
    }

    /* the adaptive rounding: int8 levels within one step of the value (a dither's within a
     * step and a half), counted once each, or a refusal */
    int8_t *levels = malloc(n + 1);
    uint64_t level_counts[255] = {0};
    int dithered = (int)(control >> 1 & 1);
    long biggest = ckz_round_levels(values, elem, n, step, control * 40503u, dithered, levels,
                                    level_counts);
    if (biggest > 127) abort();
    if (biggest >= 0) {
        uint64_t counted = 0;
        for (size_t b = 0; b < 255; b++) counted += level_counts[b];
        if (counted != n) abort();
        for (size_t i = 0; i < n; i++) {
            double v = elem == 4 ? (double)((float *)values)[i] : ((double *)values)[i];
            if (abs(levels[i]) > biggest || fabs(levels[i] * step - v) > 1.5 * step) abort();
        }
    }

    /* the searches: a k-means fit of the sorted values (its populations add up), the
     * rounding's expected entropy (a refusal or >= 0), its error sums (>= 0) */
    double *sorted = malloc(n * sizeof(double) + 8), centroids[255], sse;
    int64_t populations[255];
    for (size_t i = 0; i < n; i++)
        sorted[i] = elem == 4 ? (double)((float *)values)[i] : ((double *)values)[i];
    qsort(sorted, n, sizeof(double), ascending);
    unsigned k = 1 + count % 255;
    long fitted = ckz_lloyd_sorted(sorted, n, k, 40, centroids, populations, &sse);
    if (fitted < 0 || fitted > (long)k || (n && !fitted) || !(sse >= 0.0)) abort();
    int64_t population = 0;
    /* (its centroids ascend where the prefix sums keep the values' precision; over a range
     * of 10^600 they need not, in numpy's arithmetic as in this one) */
    for (long j = 0; j < fitted; j++) population += populations[j];
    (void)centroids;
    if (population != (int64_t)n) abort();
    if (elem == 4) {
        double bits = ckz_level_bits((const float *)values, n, step, 1 << 12), mean, spread;
        if (bits != -1.0 && !(bits >= 0.0)) abort();
        ckz_rounding_spread((const float *)values, n, step, &mean, &spread);
        if (!(mean >= 0.0 && spread >= 0.0)) abort();
    }
    free(levels);
    free(sorted);

    double energy = ckz_sum_squares(values, NULL, elem, n);
    if (!(energy >= 0.0)) abort();

    /* the dither there and back, in place: within one rounding of the shift each way */
    void *shifted = malloc(n * elem + 8);
    memcpy(shifted, values, n * elem);
    if (ckz_dither_shift(shifted, shifted, elem, n, control * 2654435761u, step, 1)) abort();
    if (ckz_dither_shift(shifted, shifted, elem, n, control * 2654435761u, step, -1)) abort();
    for (size_t i = 0; i < n; i++) {
        double v = elem == 4 ? (double)((float *)values)[i] : ((double *)values)[i];
        double w = elem == 4 ? (double)((float *)shifted)[i] : ((double *)shifted)[i];
        double slack = 2 * step + fabs(v) * (elem == 4 ? 0x1p-22 : 0x1p-51);
        if (isfinite(v) && isfinite(w) && fabs(w - v) > slack) abort();
    }
    void *compact = malloc(n * elem + 8);
    size_t kept = ckz_compact_nonzero(values, elem, n, compact), seen = 0;
    for (size_t i = 0; i < n; i++) {
        double v = elem == 4 ? (double)((float *)values)[i] : ((double *)values)[i];
        if (v == 0.0) continue;
        double c = elem == 4 ? (double)((float *)compact)[seen] : ((double *)compact)[seen];
        if (seen++ >= kept || memcmp(&c, &v, sizeof v)) abort();
    }
    if (seen != kept) abort();

    /* the sparse stage: a mask of m bytes for n elements, its values' planes after it */
    size_t m = size / 3, total = 0;
    size_t n_sparse = m ? 8 * m - (control >> 5) % 8 : 0;
    for (size_t b = 0; b < m; b++)
        for (unsigned j = 0; j < 8; j++) total += (data[b] >> j & 1u) && 8 * b + j < n_sparse;
    int beyond = m && n_sparse % 8 && data[m - 1] >> (n_sparse % 8);
    size_t sparse_count = total + (control >> 1 & 1);  /* one more than marked, sometimes */
    if (m + 2 * sparse_count > size) sparse_count = (size - m) / 2;
    int scale = (int)(control >> 2) - 32;
    float *decoded = malloc(n_sparse * sizeof(float) + 4);
    int status = ckz_sparse_unpack(data, data + m, data + m + sparse_count, sparse_count, n_sparse,
                                   scale, decoded);
    if ((status == 0) != (!beyond && total == sparse_count)) abort();
    if (status == 0) {
        uint8_t *mask = malloc(m + 1), *planes = malloc(2 * n_sparse + 2);
        double top;
        size_t again = ckz_sparse_survey(decoded, n_sparse, &top);
        size_t packed = ckz_sparse_pack(decoded, n_sparse, scale, mask, planes, planes + n_sparse,
                                        n_sparse);
        if (packed != again || packed > sparse_count) abort();
        for (size_t i = 0; i < n_sparse; i++)
            if (decoded[i] != 0.0f && !(mask[i / 8] >> (i % 8) & 1u && data[i / 8] >> (i % 8) & 1u))
                abort();
        free(mask), free(planes);
    }

    /* second moments against a base: the data's floats over the same floats one place on */
    size_t n_ratio = size / 4 > 1 ? size / 4 - 1 : 0;
    float *x = malloc(n_ratio * 4 + 8), *base = malloc(n_ratio * 4 + 8);
    float *restored = malloc(n_ratio * 4 + 8);
    double *ratios = malloc(n_ratio * 8 + 8);
    memcpy(x, data, n_ratio * 4);
    memcpy(base, data + 4, n_ratio * 4);
    int has_ratios = ckz_base_ratios(x, base, n_ratio, ratios) == 0;
    int usable = 1;
    for (size_t i = 0; i < n_ratio; i++)
        if (x[i] != 0.0f && !(isfinite(base[i]) && base[i] > 0.0f)) usable = 0;
    if (has_ratios != usable) abort();
    if (has_ratios) {
        if (ckz_ratio_restore(ratios, 8, base, n_ratio, restored)) abort();
        for (size_t i = 0; i < n_ratio; i++) {
            if (x[i] == 0.0f) {
                if (ratios[i] != 0.0 || restored[i] != 0.0f) abort();
            } else if (isnormal(x[i]) && isnormal(restored[i])
                       && fabsf(restored[i] - x[i]) > fabsf(x[i]) * 0x1p-22f) {
                abort();
            }
        }
    }
    if (ckz_ratio_restore(ratios, 3, base, n_ratio, restored) != -1) abort();
    if (ckz_sqrt_error_squares(x, base, n_ratio) < 0.0) abort();
    free(x), free(base), free(restored), free(ratios);
    free(out), free(values), free(thresholds), free(codes), free(pruned), free(shifted);
    free(compact), free(decoded);
    check_later_stages(data, size, control);
    return 0;
}
