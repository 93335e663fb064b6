/* The adaptive mode's searches over samples (modes/factoring.py, codecs/kmeans.py): the spread
 * of unbiased rounding's error for a grid step, the expected entropy of its levels, and 1-D
 * k-means (Lloyd) on sorted values.  Each is a few passes over a sample of at most a few
 * hundred thousand values; they were hundreds of small torch and numpy steps per tensor. */
#ifndef CKZ_SEARCH_H
#define CKZ_SEARCH_H

#include <stddef.h>
#include <stdint.h>

/* For n float32 values x and a grid step > 0, with f the fraction of |x| / step past its
 * lower multiple: *mean = sum f (1 - f) and *spread = sum f (1 - f) (1 - 2 f)^2, the expected
 * squared error of unbiased rounding and its variance, in units of step^2 and step^4. */
void ckz_rounding_spread(const float *x, size_t n, double step, double *mean, double *spread);

/* The bisection of modes/factoring.py _sample_step, op for op: while coarse > fine (1 +
 * tolerance), at most `rounds` times, the geometric middle of the two steps replaces fine where
 * unbiased rounding's expected squared error there, mean step^2 + sigmas sqrt(spread fraction)
 * step^2 (ckz_rounding_spread over the n float32 magnitudes x), is at most target, else coarse.
 * Returns fine; needs 0 < fine. */
double ckz_step_bisect(const float *x, size_t n, double fraction, double sigmas, double target,
                       double fine, double coarse, double tolerance, unsigned rounds);

/* The expected order-0 entropy, in bits for all n values, of the levels of x (float32) rounded
 * without bias to multiples of step > 0: a value at fraction f past level l lands on l + 1 with
 * probability f, else on l (stochastic rounding, and a subtractive dither's levels alike).  The
 * expected histogram's entropy; a draw's is within a fraction of a bit of it per level used.
 * -1 when the levels span more than `limit` (or a value is not finite, or out of memory). */
double ckz_level_bits(const float *x, size_t n, double step, size_t limit);

/* 1-D k-means of n ascending doubles into at most k (1..255) clusters, numpy's arithmetic of
 * codecs/kmeans.py lloyd_sorted op for op (the same centroids and counts): clusters split at
 * the midpoints between centroids, initialised at the middles of k - k/2 equal-population
 * slices and k/2 evenly spaced points of the range, at most `iterations` Lloyd steps.  Writes
 * the ascending centroids and their clusters' populations (arrays of k), *sse the squared
 * error; returns how many centroids, or -1 for bad arguments or out of memory. */
long ckz_lloyd_sorted(const double *values, size_t n, unsigned k, unsigned iterations,
                      double *centroids, int64_t *counts, double *sse);

/* One uniform quantizer of the adaptive search (modes/quantize.py _uniform) over n ascending
 * doubles with their prefix sums and prefix sums of squares (n + 1 each, from 0): bins split at
 * -(j - offset) step and (j - offset) step for j = levels..1 and 1..levels (levels <= 127),
 * each bin reconstructed at its mean, the middle one at zero.  out[0] = the values in the zero
 * bin, out[1] = the other bins used, out[2] = the bins' order-0 entropy in bits for all n
 * values, out[3] = the squared error (numpy's sums, pairwise).  Returns 0, or -1 for bad
 * arguments or out of memory. */
int ckz_uniform_candidate(const double *sorted, const double *sums, const double *squares,
                          size_t n, double step, double offset, long levels, double out[4]);

/* Sort n floats (elem_size 4 or 8) ascending in place, by their bits (a radix sort): the order
 * numpy's sort gives, -0.0 before 0.0 where numpy leaves them as they come (they are equal).
 * Returns 0; -1, untouched, when a value is NaN (numpy puts those last) or for a bad elem_size
 * or out of memory. */
int ckz_sort_floats(void *x, size_t n, size_t elem_size);

/* The magnitudes of n ascending doubles, largest first (out: n doubles), by one merge of the
 * negatives' run and the rest's.  Returns 0; -1 when a value is NaN. */
int ckz_descending_magnitudes(const double *ordered, size_t n, double *out);

/* A quantizer the search picked (modes/quantize.py Choice): the kept elements, the codebook
 * size (or levels used), the estimated bits, the error relative to sqrt(scale_sq), and a
 * uniform quantizer's step and rounding offset (step 0: k-means of the kept values). */
typedef struct {
    double kept, k, bits, error, step, offset;
} ckz_choice;

/* The search's constants (modes/quantize.py): kept fractions, largest first; codebook sizes,
 * smallest first (1..255); the uniform quantizers' rounding offsets, their coarsest and finest
 * steps as multiples of the values' RMS, and the bisections between; the values a candidate
 * is fitted on; Lloyd's iterations. */
typedef struct {
    const double *fractions;
    size_t n_fractions;
    const int64_t *codebooks;
    size_t n_codebooks;
    const double *offsets;
    size_t n_offsets;
    double coarsest, finest;
    unsigned bisections;
    size_t samples;
    unsigned iterations;
} ckz_search_spec;

/* modes/quantize.py search after its sort, op for op (the same choice, bit for bit): over n
 * ascending finite doubles, the cheapest candidate (k-means of the largest magnitudes at each
 * kept fraction, then the uniform quantizers) whose error is within budget, else the most
 * accurate one; with kmeans 0 a uniform quantizer first, where one fits.  Returns 0 with *out
 * set; -1 out of memory; -2 where it does not take the values (one not finite, a budget not
 * >= 0, scale_sq not > 0), which Python's search then runs; -3 for a bad spec (a fraction
 * outside [0, 1], a codebook outside 1..255, an offset outside [0, 1), steps not 0 < finest <=
 * coarsest, no samples or iterations, more than 64 bisections). */
int ckz_quantize_search(const double *ordered, size_t n, double scale_sq, double budget,
                        int kmeans, const ckz_search_spec *spec, ckz_choice *out);

#endif
