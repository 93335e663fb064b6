#include "quantize.h"

/* Thresholds padded with +inf to 256 entries: a branch-free binary search of 8 halvings then
 * counts those below a value for any count up to 255. */
static void padded(const double *thresholds, size_t count, double table[256]) {
    for (size_t i = 0; i < 256; i++) table[i] = i < count ? thresholds[i] : __builtin_inf();
}

/* The number of padded thresholds strictly below v: the first index whose threshold is >= v. */
static inline unsigned below(const double table[256], double v) {
    unsigned index = 0;
    for (unsigned half = 128; half; half >>= 1)
        index += table[index + half - 1] < v ? half : 0;
    return index + (table[index] < v);
}

int ckz_nearest_codes(const void *x, size_t elem_size, size_t n, const double *thresholds,
                      size_t count, uint8_t *out) {
    if ((elem_size != 4 && elem_size != 8) || count >= CKZ_MAX_CENTROIDS) return -1;
    double table[256];
    padded(thresholds, count, table);
    if (elem_size == 4) {
        const float *f = (const float *)x;
        for (size_t i = 0; i < n; i++) {
            double v = (double)f[i];
            out[i] = (uint8_t)(v == 0.0 ? 0 : 1 + below(table, v));
        }
    } else {
        const double *d = (const double *)x;
        for (size_t i = 0; i < n; i++) {
            double v = d[i];
            out[i] = (uint8_t)(v == 0.0 ? 0 : 1 + below(table, v));
        }
    }
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
