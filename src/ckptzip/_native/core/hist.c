/* hist.c - byte histograms, the noise screen and the used range of a table (see hist.h). */
#include "hist.h"

#include <math.h>
#include <string.h>
#if CKZ_DISPATCH
#include <immintrin.h>
#elif defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- per-quarter byte counts ----------------------------------------------------------------- */

CKZ_INLINE void count_impl(const uint8_t *src, size_t n,
                           uint32_t counts[CKZ_HIST_QUARTERS][256]) {
    /* Two sub-histograms per stream (even and odd positions): a run of one symbol then updates a
     * given counter only every 8th increment, so increments do not wait on each other's stores. */
    uint32_t h[2 * CKZ_HIST_QUARTERS][256];
    memset(h, 0, sizeof h);
    const uint8_t *s[CKZ_HIST_QUARTERS];
    size_t m[CKZ_HIST_QUARTERS];
    for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++) {
        m[k] = ckz_quarter_count(n, k);
        s[k] = src + ckz_quarter_start(n, k);
    }
    /* Quarter sizes never increase with k, so m[3] positions exist in every quarter.  Eight
     * positions per stream per step, from one 64-bit load each: a quarter of the load uops of
     * byte loads, the bytes taken apart by shifts. */
    size_t common = m[CKZ_HIST_QUARTERS - 1] & ~(size_t)7, i;
    for (i = 0; i < common; i += 8) {
        uint64_t w0 = ckz_load64(s[0] + i), w1 = ckz_load64(s[1] + i);
        uint64_t w2 = ckz_load64(s[2] + i), w3 = ckz_load64(s[3] + i);
        for (unsigned b = 0; b < 64; b += 16) {
            h[0][(w0 >> b) & 0xff]++; h[1][(w0 >> (b + 8)) & 0xff]++;
            h[2][(w1 >> b) & 0xff]++; h[3][(w1 >> (b + 8)) & 0xff]++;
            h[4][(w2 >> b) & 0xff]++; h[5][(w2 >> (b + 8)) & 0xff]++;
            h[6][(w3 >> b) & 0xff]++; h[7][(w3 >> (b + 8)) & 0xff]++;
        }
    }
    for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++)
        for (size_t j = common; j < m[k]; j++) h[2 * k][s[k][j]]++;
    for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++)
        for (unsigned v = 0; v < 256; v++) counts[k][v] = h[2 * k][v] + h[2 * k + 1][v];
}
CKZ_VERSIONED(count, (const uint8_t *src, size_t n, uint32_t counts[CKZ_HIST_QUARTERS][256]),
              (src, n, counts))

/* The window counter of ckz_hist_count. */
#define WINDOW_VALUES 16
#define WINDOW_SAMPLES 512
#define WINDOW_HIT_NUM 31
#define WINDOW_HIT_DEN 32

#if CKZ_DISPATCH
/* The window counter's kernels (CKZ_LEVEL_V4 and V3) */

CKZ_TARGET_V4 static void
window_count_v4(const uint8_t *c, size_t n, unsigned lo, uint32_t h[256]) {
    uint64_t cnt[WINDOW_VALUES] = {0};
    __m512i base = _mm512_set1_epi8((char)lo), top = _mm512_set1_epi8(WINDOW_VALUES - 1);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        /* x - lo wraps below lo, so one unsigned compare finds the bytes outside the window */
        __m512i d = _mm512_sub_epi8(_mm512_loadu_si512((const void *)(c + i)), base);
        uint64_t out = _mm512_cmpgt_epu8_mask(d, top);
        for (unsigned v = 0; v < WINDOW_VALUES; v++)
            cnt[v] += (uint64_t)__builtin_popcountll(
                _mm512_cmpeq_epi8_mask(d, _mm512_set1_epi8((char)v)));
        while (out) {
            h[c[i + (unsigned)__builtin_ctzll(out)]]++;
            out &= out - 1;
        }
    }
    for (; i < n; i++) h[c[i]]++;
    for (unsigned v = 0; v < WINDOW_VALUES; v++) h[lo + v] += (uint32_t)cnt[v];
}

/* AVX2: 32 bytes a step, each window value's hits counted in a byte accumulator (a compare and
 * a subtract), the accumulators summed into cnt every 255 steps, before a byte can wrap. */
CKZ_TARGET_V3 static void
window_count_v3(const uint8_t *c, size_t n, unsigned lo, uint32_t h[256]) {
    uint64_t cnt[WINDOW_VALUES] = {0};
    const __m256i base = _mm256_set1_epi8((char)lo), top = _mm256_set1_epi8(WINDOW_VALUES - 1);
    size_t i = 0;
    while (i + 32 <= n) {
        __m256i acc[WINDOW_VALUES];
        for (unsigned v = 0; v < WINDOW_VALUES; v++) acc[v] = _mm256_setzero_si256();
        for (unsigned k = 0; k < 255 && i + 32 <= n; k++, i += 32) {
            __m256i d = _mm256_sub_epi8(_mm256_loadu_si256((const __m256i *)(c + i)), base);
            /* x - lo wraps below lo: d <= 15 unsigned exactly for the window's bytes */
            uint32_t out = ~(uint32_t)_mm256_movemask_epi8(
                _mm256_cmpeq_epi8(_mm256_min_epu8(d, top), d));
            for (unsigned v = 0; v < WINDOW_VALUES; v++)
                acc[v] = _mm256_sub_epi8(acc[v], _mm256_cmpeq_epi8(d, _mm256_set1_epi8((char)v)));
            while (out) {
                h[c[i + (unsigned)__builtin_ctz(out)]]++;
                out &= out - 1;
            }
        }
        for (unsigned v = 0; v < WINDOW_VALUES; v++) {
            __m256i sums = _mm256_sad_epu8(acc[v], _mm256_setzero_si256());
            cnt[v] += (uint64_t)_mm256_extract_epi64(sums, 0) + (uint64_t)_mm256_extract_epi64(sums, 1) +
                      (uint64_t)_mm256_extract_epi64(sums, 2) + (uint64_t)_mm256_extract_epi64(sums, 3);
        }
    }
    for (; i < n; i++) h[c[i]]++;
    for (unsigned v = 0; v < WINDOW_VALUES; v++) h[lo + v] += (uint32_t)cnt[v];
}
#endif

/* The first value of the window of WINDOW_VALUES that holds >= 31/32 of an even sample of src,
 * where the window counter is available; else 256. */
static unsigned byte_window(const uint8_t *src, size_t n) {
#if CKZ_DISPATCH
    if (!CKZ_CPU_AT(V3) || n < 8 * WINDOW_SAMPLES) return 256;
    uint32_t sample[256] = {0};
    size_t stride = n / WINDOW_SAMPLES;
    for (size_t j = 0; j < WINDOW_SAMPLES; j++) sample[src[j * stride]]++;
    unsigned lo = 0, best = 0, run = 0; /* the window [lo, lo + WINDOW_VALUES) with most */
    for (unsigned v = 0; v < 256; v++) {
        run += sample[v] - (v >= WINDOW_VALUES ? sample[v - WINDOW_VALUES] : 0);
        if (run > best)
            best = run, lo = v + 1 >= WINDOW_VALUES ? v + 1 - WINDOW_VALUES : 0;
    }
    if (best * WINDOW_HIT_DEN >= WINDOW_SAMPLES * WINDOW_HIT_NUM) return lo;
#else
    (void)src, (void)n;
#endif
    return 256;
}

/* h[v] += occurrences of v in src[0..n), for a window start lo from byte_window. */
static void window_count(const uint8_t *src, size_t n, unsigned lo, uint32_t h[256]) {
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(V4) && lo + WINDOW_VALUES <= 256) {
        window_count_v4(src, n, lo, h);
        return;
    }
    if (CKZ_CPU_AT(V3) && lo + WINDOW_VALUES <= 256) {
        window_count_v3(src, n, lo, h);
        return;
    }
#endif
    (void)lo;
    for (size_t i = 0; i < n; i++) h[src[i]]++;
}

void ckz_hist_count(const uint8_t *src, size_t n, uint32_t counts[CKZ_HIST_QUARTERS][256]) {
    unsigned lo = byte_window(src, n);
    if (lo < 256) {
        for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++) {
            memset(counts[k], 0, sizeof counts[k]);
            window_count(src + ckz_quarter_start(n, k), ckz_quarter_count(n, k), lo,
                         counts[k]);
        }
        return;
    }
    count(src, n, counts);
}

void ckz_hist_total(const uint8_t *src, size_t n, uint32_t h[256]) {
    memset(h, 0, 256 * sizeof h[0]);
    uint32_t quarters[CKZ_HIST_QUARTERS][256];
    ckz_hist_count(src, n, quarters);
    for (unsigned v = 0; v < 256; v++)
        for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++) h[v] += quarters[k][v];
}

/* ---- (bucket, byte) counts ------------------------------------------------------------------- */

#if CKZ_DISPATCH
/* Adds to hist[b * 256 + v] every byte v of bucket b = bk[i] < 16 that is not the bucket's guess
 * dom[b]: 32 bytes compared with their guesses (a byte shuffle of dom by bk) per step, then only
 * the misses counted one by one. */
CKZ_TARGET_V3 static void count_misses(const uint8_t *s, const uint8_t *bk, size_t n,
                                       const uint8_t dom[16], uint32_t *hist) {
    __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)dom));
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(bk + i));
        __m256i v = _mm256_loadu_si256((const __m256i *)(s + i));
        uint32_t miss =
            ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_shuffle_epi8(lut, b), v));
        while (miss) {
            unsigned j = (unsigned)__builtin_ctz(miss);
            hist[(uint32_t)bk[i + j] << 8 | s[i + j]]++;
            miss &= miss - 1;
        }
    }
    for (; i < n; i++)
        if (s[i] != dom[bk[i]]) hist[(uint32_t)bk[i] << 8 | s[i]]++;
}
#endif

/* Low-entropy planes (a high residual byte: mostly one value per bucket) take count_misses
 * when a sample of MISS_SAMPLES bytes guesses at least MISS_HIT_NUM / MISS_HIT_DEN of them. */
#define MISS_SAMPLES 512
#define MISS_HIT_NUM 15
#define MISS_HIT_DEN 16

/* Four interleaved copies (hist and the three of spare), so that a run of equal (bucket, byte)
 * pairs - a high residual plane is mostly zeros - does not serialize on one counter's store and
 * load. */
void ckz_hist_buckets(const uint8_t *s, const uint8_t *bk, size_t n, unsigned B,
                      const size_t *size, uint32_t *hist, uint32_t *spare) {
    size_t span = (size_t)B * 256;
    uint32_t *h1 = spare, *h2 = spare + span, *h3 = spare + 2 * span;
    memset(hist, 0, span * sizeof *hist);
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(V3) && B <= 16 && n >= 16 * MISS_SAMPLES) {
        /* Each bucket's most frequent byte in an even sample (spare as its histogram), then
         * the misses counted exactly; a bucket's guessed byte has what the misses leave of it. */
        uint32_t *c = spare;
        memset(c, 0, span * sizeof *c);
        size_t stride = n / MISS_SAMPLES;
        uint8_t dom[16] = {0}; /* the leader so far (the first byte to reach its count) */
        for (size_t j = 0; j < MISS_SAMPLES; j++) {
            unsigned b = bk[j * stride], v = s[j * stride];
            if (++c[b << 8 | v] > c[b << 8 | dom[b]]) dom[b] = (uint8_t)v;
        }
        uint32_t hits = 0;
        for (unsigned b = 0; b < B; b++) hits += c[b << 8 | dom[b]];
        if ((uint64_t)hits * MISS_HIT_DEN >= (uint64_t)MISS_SAMPLES * MISS_HIT_NUM) {
            count_misses(s, bk, n, dom, hist);
            for (unsigned b = 0; b < B; b++) {
                size_t missed = 0;
                for (unsigned v = 0; v < 256; v++) missed += hist[b * 256 + v];
                hist[b * 256 + dom[b]] = (uint32_t)(size[b] - missed);
            }
            return;
        }
    }
#else
    (void)size;
#endif
    memset(spare, 0, 3 * span * sizeof *spare);
    size_t i = 0;
#if defined(__x86_64__) && defined(__SSE2__)
    /* The (bucket, byte) indices 16 at a time: two loads and two byte interleaves, then four
     * 64-bit words of four indices each; the counters' loads are then the only scalar ones. */
    for (; i + 16 <= n; i += 16) {
        __m128i sv = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i bv = _mm_loadu_si128((const __m128i *)(bk + i));
        __m128i lo = _mm_unpacklo_epi8(sv, bv), hi = _mm_unpackhi_epi8(sv, bv);
        uint64_t w[4] = {(uint64_t)_mm_cvtsi128_si64(lo),
                         (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(lo, lo)),
                         (uint64_t)_mm_cvtsi128_si64(hi),
                         (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(hi, hi))};
        for (unsigned j = 0; j < 4; j++) {
            hist[w[j] & 0xffff]++;
            h1[(w[j] >> 16) & 0xffff]++;
            h2[(w[j] >> 32) & 0xffff]++;
            h3[w[j] >> 48]++;
        }
    }
#endif
    for (; i + 4 <= n; i += 4) {
        hist[(uint32_t)bk[i] << 8 | s[i]]++;
        h1[(uint32_t)bk[i + 1] << 8 | s[i + 1]]++;
        h2[(uint32_t)bk[i + 2] << 8 | s[i + 2]]++;
        h3[(uint32_t)bk[i + 3] << 8 | s[i + 3]]++;
    }
    for (; i < n; i++) hist[(uint32_t)bk[i] << 8 | s[i]]++;
    for (size_t j = 0; j < span; j++) hist[j] += h1[j] + h2[j] + h3[j];
}

/* ---- noise screen ---------------------------------------------------------------------------- */

#define SCREEN_SAMPLES 8192
#define SCREEN_BITS 7.8

int ckz_looks_like_noise(const uint8_t *s, size_t m) {
    if (m < CKZ_SCREEN_MIN) return 0;
    /* Four sub-histograms: on a low-entropy plane most samples hit one counter, and one
     * histogram would serialize the increments on its store-to-load latency. */
    uint32_t h[256], g[3][256];
    memset(h, 0, sizeof h);
    memset(g, 0, sizeof g);
    size_t stride = m / SCREEN_SAMPLES;
    _Static_assert(SCREEN_SAMPLES % 4 == 0, "four sub-histograms");
    for (size_t i = 0; i < SCREEN_SAMPLES; i += 4) {
        h[s[i * stride]]++;
        g[0][s[(i + 1) * stride]]++;
        g[1][s[(i + 2) * stride]]++;
        g[2][s[(i + 3) * stride]]++;
    }
    for (unsigned v = 0; v < 256; v++) h[v] += g[0][v] + g[1][v] + g[2][v];
    double pairs = 0; /* sum c(c-1) / (N(N-1)) estimates sum p^2 without bias */
    for (unsigned v = 0; v < 256; v++) pairs += (double)h[v] * (h[v] - (h[v] > 0));
    double collide = pairs / ((double)SCREEN_SAMPLES * (SCREEN_SAMPLES - 1));
    return collide > 0 && -log2(collide) >= SCREEN_BITS;
}

/* ---- used range ------------------------------------------------------------------------------ */

/* An entry is nonzero when any of its bytes is: the same whatever the byte order. */
static int entry_used(const uint8_t *t, size_t entry_bytes, unsigned i) {
    for (size_t b = 0; b < entry_bytes; b++)
        if (t[i * entry_bytes + b]) return 1;
    return 0;
}

void ckz_used_range(const void *table, size_t entry_bytes, unsigned *lo, unsigned *hi) {
    const uint8_t *t = table;
    unsigned a = 0, b = 255;
    while (a < 255 && !entry_used(t, entry_bytes, a)) a++;
    while (b > a && !entry_used(t, entry_bytes, b)) b--;
    *lo = a, *hi = b;
}
