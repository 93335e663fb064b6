/* ctx.c - byte planes coded against a per-element context (see ctx.h for the model,
 * docs/STREAMS.md for the layouts).
 *
 * Format 3 (written): the context histogram gives the buckets and each element's bucket index;
 * the planes are split in element order, and each coded plane is one RANS32 stream whose symbol
 * i takes the table of bucket(ctx[i]) (ckz_rans32_encode_tab): no permutation, one stream per
 * plane.  Per plane the encoder picks RAW, CONST, one table, or a table per bucket (each bucket's
 * table uniform, single-valued or coded) by computed sizes.
 * Format 2 (decoded only): the planes permuted into bucket order, one segment per (plane,
 * bucket); the decoder decodes the segments into a bucket-ordered scratch and gathers.
 */
#include "ctx.h"

#include <math.h>
#include <stdlib.h>
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "hist.h"
#include "memory.h"
#include "planes.h"
#include "rans.h"
#include "residual.h"

_Static_assert(CKZ_CTX_MAX_BUCKETS * CKZ_CTX_MIN_BUCKET > 0, "bucket bounds");

/* The permutation: cur[l][v] is where the next element of lane l with context v goes in the
 * bucket-ordered planes; size[b] is bucket b's element count, B the bucket count. */
typedef struct {
    size_t cur[CKZ_CTX_LANES][256];
    size_t size[CKZ_CTX_MAX_BUCKETS];
    unsigned buckets;
} layout;

CKZ_INLINE void store_elem(uint8_t *p, uint64_t w, unsigned k) {
    switch (k) {
    case 1: p[0] = (uint8_t)w; break;
    case 2: p[0] = (uint8_t)w, p[1] = (uint8_t)(w >> 8); break;
    case 4: ckz_store32(p, (uint32_t)w); break;
    default: ckz_store64(p, w); break;
    }
}

/* Right rotation of a (8k)-bit word held in a uint64; 8k is a power of two, so `& (bits - 1)`
 * keeps rotate == 0 from shifting by the full width. */
CKZ_INLINE uint64_t rotr_k(uint64_t w, unsigned r, unsigned k) {
    unsigned bits = 8 * k;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    return ((w >> r) | (w << ((bits - r) & (bits - 1)))) & mask;
}

/* ---- context bytes -------------------------------------------------------------------------- */

/* One loop per element width, on the unsigned type of that width (a uint64 rotation of a
 * narrower word does not vectorize): rotl by r, then the top byte.  `& (BITS - 1)` keeps r == 0
 * from shifting by the full width. */
#define CONTEXT_K(K, T, BITS)                                                                  \
    CKZ_INLINE void context##K##_impl(const uint8_t *restrict src, size_t n, unsigned r,         \
                                      uint8_t *restrict ctx) {                                 \
        for (size_t i = 0; i < n; i++) {                                                       \
            T x;                                                                               \
            memcpy(&x, src + i * K, K);                                                        \
            T y = (T)((T)(x << r) | (T)(x >> ((BITS - r) & (BITS - 1))));                      \
            ctx[i] = (uint8_t)(y >> (BITS - 8));                                               \
        }                                                                                      \
    }                                                                                          \
    CKZ_VERSIONED(context##K, (const uint8_t *restrict src, size_t n, unsigned r,              \
                               uint8_t *restrict ctx), (src, n, r, ctx))
CONTEXT_K(1, uint8_t, 8)
CONTEXT_K(2, uint16_t, 16)
CONTEXT_K(4, uint32_t, 32)
CONTEXT_K(8, uint64_t, 64)

void ckz_context_bytes(const uint8_t *src, size_t n, unsigned elem_size, unsigned rotate,
                       uint8_t *ctx) {
    switch (elem_size) {
    case 1: context1(src, n, rotate, ctx); break;
    case 2: context2(src, n, rotate, ctx); break;
    case 4: context4(src, n, rotate, ctx); break;
    default: context8(src, n, rotate, ctx); break;
    }
}

/* ---- buckets and the permutation ------------------------------------------------------------ */

static size_t min_bucket(size_t n) {
    size_t spread = (n + CKZ_CTX_MAX_BUCKETS - 1) / CKZ_CTX_MAX_BUCKETS;
    return spread > CKZ_CTX_MIN_BUCKET ? spread : CKZ_CTX_MIN_BUCKET;
}

/* The bucket rule (format constants; the decoder recomputes it): walk the context values upwards,
 * closing a bucket as soon as it holds min_bucket(n) elements; a last, smaller run joins the
 * bucket before it (or is the only bucket).  Every closed bucket holds >= n /
 * CKZ_CTX_MAX_BUCKETS elements, so there are at most that many, and every bucket is non-empty
 * (B = 0 only for n = 0).  h: the context histogram.  Sets size[b] and first[b], the
 * lowest context value of bucket b (first[0] = 0; values are bucketed monotonically), and
 * returns B. */
static unsigned plan_buckets(const uint32_t h[256], size_t n, size_t size[CKZ_CTX_MAX_BUCKETS],
                             uint8_t first[CKZ_CTX_MAX_BUCKETS]) {
    size_t least = min_bucket(n);
    unsigned b = 0;
    memset(size, 0, CKZ_CTX_MAX_BUCKETS * sizeof size[0]);
    memset(first, 0, CKZ_CTX_MAX_BUCKETS);
    for (unsigned v = 0; v < 256; v++) {
        size_t acc = h[v];
        /* b < CKZ_CTX_MAX_BUCKETS when acc > 0: b closed buckets hold b * least <= n - acc
         * elements, and least >= n / CKZ_CTX_MAX_BUCKETS. */
        if (acc) {
            if (!size[b]) first[b] = (uint8_t)v;
            size[b] += acc;
            if (size[b] >= least) b++;
        }
    }
    if (b < CKZ_CTX_MAX_BUCKETS && size[b]) {
        if (b) size[b - 1] += size[b], size[b] = 0; /* short tail joins its neighbour */
        else b = 1;                                 /* the only bucket */
    }
    return b;
}

/* Format 2's permutation on top of the buckets: cur[l][v] starts at the elements of value v in
 * lane l, in (value, lane) order. */
static void plan_layout(const uint8_t *ctx, size_t n, layout *L) {
    uint32_t h[CKZ_CTX_LANES][256];
    uint8_t first[CKZ_CTX_MAX_BUCKETS];
    ckz_hist_count(ctx, n, h);
    size_t pos = 0;
    for (unsigned v = 0; v < 256; v++)
        for (unsigned l = 0; l < CKZ_CTX_LANES; l++) {
            L->cur[l][v] = pos;
            pos += h[l][v];
        }
    uint32_t total[256];
    for (unsigned v = 0; v < 256; v++) {
        total[v] = 0;
        for (unsigned l = 0; l < CKZ_CTX_LANES; l++) total[v] += h[l][v];
    }
    L->buckets = plan_buckets(total, n, L->size, first);
}

/* Element i of lane l goes to cur[l][ctx[i]]++ in every plane.  The lanes run in lockstep so
 * that the four cursor increments (a store-to-load chain when contexts repeat) overlap. */
#define FOR_EACH_ELEMENT(BODY)                                                                 \
    do {                                                                                       \
        size_t start_[CKZ_CTX_LANES], count_[CKZ_CTX_LANES];                                   \
        for (unsigned l_ = 0; l_ < CKZ_CTX_LANES; l_++) {                                      \
            start_[l_] = ckz_quarter_start(n, l_);                                          \
            count_[l_] = ckz_quarter_count(n, l_);                                          \
        }                                                                                      \
        size_t common_ = count_[CKZ_CTX_LANES - 1];                                            \
        for (size_t t_ = 0; t_ < common_; t_++) {                                              \
            { const unsigned l = 0; size_t i = start_[0] + t_; BODY }                          \
            { const unsigned l = 1; size_t i = start_[1] + t_; BODY }                          \
            { const unsigned l = 2; size_t i = start_[2] + t_; BODY }                          \
            { const unsigned l = 3; size_t i = start_[3] + t_; BODY }                          \
        }                                                                                      \
        for (unsigned l = 0; l < CKZ_CTX_LANES; l++)                                           \
            for (size_t i = start_[l] + common_; i < start_[l] + count_[l]; i++) { BODY }      \
    } while (0)
_Static_assert(CKZ_CTX_LANES == 4, "FOR_EACH_ELEMENT unrolls four lanes");

CKZ_INLINE void gather_k_impl(const uint8_t *restrict planes, const uint8_t *restrict ctx,
                              size_t n, unsigned k, unsigned r, layout *L,
                              uint8_t *restrict dst) {
    FOR_EACH_ELEMENT({
        size_t j = L->cur[l][ctx[i]]++;
        uint64_t w = 0;
        for (unsigned p = 0; p < k; p++) w |= (uint64_t)planes[p * n + j] << (8 * p);
        store_elem(dst + i * k, rotr_k(w, r, k), k);
    });
}

#define PERMUTE_K(K)                                                                           \
    CKZ_INLINE void gather##K##_impl(const uint8_t *restrict planes,                           \
                                     const uint8_t *restrict ctx, size_t n, unsigned r,        \
                                     layout *L, uint8_t *restrict dst) {                       \
        gather_k_impl(planes, ctx, n, K, r, L, dst);                                           \
    }                                                                                          \
    CKZ_VERSIONED(gather##K, (const uint8_t *restrict planes, const uint8_t *restrict ctx,     \
                              size_t n, unsigned r, layout *L, uint8_t *restrict dst),         \
                  (planes, ctx, n, r, L, dst))
PERMUTE_K(1)
PERMUTE_K(2)
PERMUTE_K(4)
PERMUTE_K(8)

/* ---- format 3: bucket indices and bucket tables ------------------------------------------------ */

#define PROB_BITS CKZ_RANS_PROB_BITS
#define SCALE CKZ_RANS_PROB_SCALE

/* Buckets of a context: B, sizes, each bucket's lowest context value. */
typedef struct {
    unsigned count;
    size_t size[CKZ_CTX_MAX_BUCKETS];
    uint8_t first[CKZ_CTX_MAX_BUCKETS];
} buckets;

#if CKZ_DISPATCH
#include <immintrin.h>

/* bk[i] = lut[ctx[i]] for i < n, 64 bytes a step: two two-table byte permutes (the LUT's low
 * and high 128 entries) and a blend on the context's top bit. */
CKZ_TARGET_V4 static size_t lut_index_v4(const uint8_t *ctx, size_t n, const uint8_t lut[256],
                                         uint8_t *bk) {
    __m512i t0 = _mm512_loadu_si512((const void *)lut);
    __m512i t1 = _mm512_loadu_si512((const void *)(lut + 64));
    __m512i t2 = _mm512_loadu_si512((const void *)(lut + 128));
    __m512i t3 = _mm512_loadu_si512((const void *)(lut + 192));
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i x = _mm512_loadu_si512((const void *)(ctx + i));
        __m512i a = _mm512_permutex2var_epi8(t0, x, t1), b = _mm512_permutex2var_epi8(t2, x, t3);
        _mm512_storeu_si512((void *)(bk + i), _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), a, b));
    }
    return i;
}

/* AVX2, when the bucket starts first[1..B) lie within 31 values: d = min(ctx - (first[1] - 1),
 * 31), saturating at 0, then bk = win[d] by two 16-entry byte shuffles and a blend on d >= 16.
 * Every ctx below first[1] gives d = 0 and every ctx from first[1] + 30 up gives d = 31, whose
 * entries are bucket 0 and bucket B - 1.  32 bytes a step; returns the elements done. */
CKZ_TARGET_V3 static size_t window_index_v3(const uint8_t *ctx, size_t n,
                                            const uint8_t *first, unsigned B,
                                            uint8_t *bk) {
    uint8_t win[32];
    for (unsigned d = 0, b = 0; d < 32; d++) {
        unsigned v = first[1] - 1u + d;
        while (b + 1 < B && v >= first[b + 1]) b++;
        win[d] = (uint8_t)b;
    }
    const __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)win));
    const __m256i hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(win + 16)));
    const __m256i start = _mm256_set1_epi8((char)(first[1] - 1)), top = _mm256_set1_epi8(31);
    const __m256i fifteen = _mm256_set1_epi8(15);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(ctx + i));
        __m256i d = _mm256_min_epu8(_mm256_subs_epu8(x, start), top);
        __m256i v = _mm256_blendv_epi8(_mm256_shuffle_epi8(lo, d), _mm256_shuffle_epi8(hi, d),
                                       _mm256_cmpgt_epi8(d, fifteen));
        _mm256_storeu_si256((__m256i *)(bk + i), v);
    }
    return i;
}
#endif

static void find_buckets(const uint8_t *ctx, size_t n, buckets *bs) {
    uint32_t h[256]; /* exponent bytes: ckz_hist_count counts them by window compares */
    ckz_hist_total(ctx, n, h);
    bs->count = plan_buckets(h, n, bs->size, bs->first);
}

/* bk[i] = bucket of ctx[i] = how many of the bucket starts first[1..B) are <= ctx[i] (buckets are
 * value ranges in order).  One vectorizable pass per start over blocks that stay in L1. */
CKZ_INLINE void bucket_index_passes_impl(const uint8_t *restrict ctx, size_t n,
                                         const uint8_t *restrict first, unsigned B,
                                         uint8_t *restrict bk) {
    for (size_t i0 = 0; i0 < n; i0 += 4096) {
        size_t m = n - i0 < 4096 ? n - i0 : 4096;
        const uint8_t *restrict c = ctx + i0;
        uint8_t *restrict o = bk + i0;
        memset(o, 0, m);
        for (unsigned b = 1; b < B; b++) {
            uint8_t t = first[b];
            for (size_t i = 0; i < m; i++) o[i] = (uint8_t)(o[i] + (c[i] >= t));
        }
    }
}
CKZ_VERSIONED(bucket_index_passes, (const uint8_t *restrict ctx, size_t n,
                                    const uint8_t *restrict first, unsigned B,
                                    uint8_t *restrict bk), (ctx, n, first, B, bk))

static void bucket_index(const uint8_t *ctx, size_t n, const uint8_t *first, unsigned B,
                         uint8_t *bk) {
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(V4) && B > 2) { /* one lookup instead of B - 1 compare passes */
        uint8_t lut[256];
        for (unsigned v = 0, b = 0; v < 256; v++) {
            while (b + 1 < B && v >= first[b + 1]) b++;
            lut[v] = (uint8_t)b;
        }
        size_t done = lut_index_v4(ctx, n, lut, bk);
        for (size_t i = done; i < n; i++) bk[i] = lut[ctx[i]];
        return;
    }
    if (CKZ_CPU_AT(V3) && B > 2 && first[B - 1] - first[1] <= 30) {
        size_t done = window_index_v3(ctx, n, first, B, bk);
        bucket_index_passes(ctx + done, n - done, first, B, bk + done);
        return;
    }
#endif
    bucket_index_passes(ctx, n, first, B, bk);
}

/* A bucket's table (docs/STREAMS.md, format 3).  The plane's frequencies are multiples of its
 * unit 2^s (s = 0..3, stored once per plane): a bucket's statistics rarely need all of SCALE's
 * precision, and the decoder's tables shrink to SCALE >> s entries (L1-resident for ~7 buckets
 * at s = 2).  Byte `tag`, low two bits the kind:
 *   UNIFORM  every value has frequency 16: the bytes cost exactly 8 bits (a RAW bucket);
 *   SINGLE   then u8 v: v has frequency SCALE - 2^s and v ^ 1 frequency 2^s (a CONST bucket;
 *            rANS has no frequency SCALE, and 2^s / 4096 costs <= 0.003 bits per element);
 *   CODED    bits 2-4 an exp-Golomb order g (bits 5-7 zero): then u8 first, u8 count - 1, and
 *            count exp-Golomb-g codes of f / 2^s for the values first .. first + count - 1,
 *            LSB-first bits, zero-padded to a byte. */
enum { TAB_UNIFORM = 0, TAB_SINGLE = 1, TAB_CODED = 2 };
#define MAX_SHIFT 3
#define MAX_ORDER 7
#define EG_MAX_ZEROS 12 /* a code of f / 2^s < 2^12 has at most 12 leading zeros */

typedef struct {
    uint8_t kind, value, order; /* value: SINGLE; order: CODED */
    uint16_t freq[256];         /* the frequencies (summing to SCALE) the coder uses */
    double bits;                /* table and code bits of this bucket's bytes */
} bucket_table;

static unsigned bit_length(uint32_t v) { return v ? 32u - (unsigned)__builtin_clz(v) : 0; }

static void fill_uniform(uint16_t freq[256]) {
    for (unsigned v = 0; v < 256; v++) freq[v] = SCALE / 256;
}

static void fill_single(uint16_t freq[256], unsigned v, unsigned shift) {
    memset(freq, 0, 256 * sizeof freq[0]);
    freq[v] = (uint16_t)(SCALE - (1u << shift));
    freq[v ^ 1] = (uint16_t)(1u << shift);
}

/* A candidate of normalize_bucket's sum correction: the code bits that moving one unit of
 * value v costs (down: the unit taken away; up: given, negative), as the scan computed it,
 * packed as an integer key: the float's bits made monotone (sign set: all flipped, else the
 * sign flipped) above v, so that key order is (cost, value) order. */
static uint64_t corr_key(uint32_t h, unsigned f, int down, unsigned v) {
    float c = down ? (float)h * (ckz_rans_log2[f] - ckz_rans_log2[f - 1])
                   : -(float)h * (ckz_rans_log2[f + 1] - ckz_rans_log2[f]);
    uint32_t u;
    memcpy(&u, &c, sizeof u);
    u ^= (u >> 31) ? 0xffffffffu : 0x80000000u;
    return (uint64_t)u << 32 | v;
}

/* Sifts heap[j] down a min-heap of k keys. */
static void corr_sift(uint64_t *heap, unsigned k, unsigned j) {
    uint64_t x = heap[j];
    for (;;) {
        unsigned c = 2 * j + 1;
        if (c >= k) break;
        if (c + 1 < k) c += heap[c + 1] < heap[c];
        if (heap[c] >= x) break;
        heap[j] = heap[c];
        j = c;
    }
    heap[j] = x;
}

/* Frequencies summing to 2^prec for the counts h[lo..hi] (>= 2 used, total m): rounded to the
 * nearest, at least 1, then the sum corrected one unit at a time where that costs fewest code
 * bits (count * log2 of the frequency ratio).  Coarse units need this: truncation (as
 * ckz_rans_normalize does) loses ~1 % at 2^9 units on 200-symbol planes. */
static void normalize_bucket(const uint32_t *h, const uint8_t *used, unsigned distinct, size_t m,
                             unsigned prec, uint16_t f[256]) {
    uint32_t scale = 1u << prec;
    int64_t sum = 0;
    memset(f, 0, 256 * sizeof f[0]);
    /* q = round(h scale / m) = floor(num / den), num = 2 h scale + m < 2^46, den = 2 m <= 2^33:
     * from the double quotient (off by at most one), then corrected exactly. */
    uint64_t den = 2 * (uint64_t)m;
    double inv = 1.0 / (double)den;
    for (unsigned j = 0; j < distinct; j++) {
        unsigned v = used[j];
        uint64_t num = (uint64_t)h[v] * scale * 2 + m;
        uint64_t q = (uint64_t)((double)num * inv);
        if (q * den > num) q--;
        else if (num - q * den >= den) q++;
        f[v] = (uint16_t)(q ? (q < scale ? q : scale - 1) : 1);
        sum += f[v];
    }
    if (sum == scale) return;
    /* sum > scale: take a unit from the symbol that loses least (f > 1), until the sum is
     * right; else give one to the symbol that gains most (f < scale - 1).  The direction never
     * changes, and a step changes only its own symbol's cost, so the candidates live in a heap
     * ordered by (cost, value): the same choices as scanning lo..hi for the first least cost
     * at every step. */
    int down = sum > (int64_t)scale;
    uint64_t heap[256];
    unsigned k = 0;
    for (unsigned j = 0; j < distinct; j++) {
        unsigned v = used[j];
        if (down ? f[v] > 1 : f[v] < scale - 1) heap[k++] = corr_key(h[v], f[v], down, v);
    }
    for (unsigned j = k / 2; j-- > 0;) corr_sift(heap, k, j);
    while (sum != scale) {
        unsigned v = (unsigned)(heap[0] & 0xff); /* k > 0: a sum off by d leaves >= d units */
        f[v] = (uint16_t)(f[v] + (down ? -1 : 1));
        sum += down ? -1 : 1;
        if (down ? f[v] > 1 : f[v] < scale - 1) heap[0] = corr_key(h[v], f[v], down, v);
        else heap[0] = heap[--k];
        corr_sift(heap, k, 0);
    }
}

/* Code bits of counts h[lo..hi] under freq (summing to 2^prec). */
static double code_bits(const uint32_t *h, unsigned lo, unsigned hi, const uint16_t *freq,
                        unsigned prec) {
    double bits = 0;
    for (unsigned v = lo; v <= hi; v++)
        if (h[v]) bits += (double)h[v] * (prec - ckz_rans_log2[freq[v]]);
    return bits;
}

/* A bucket's values: the used ones in increasing order (h[used[j]] > 0), found once per plane
 * and shared by the units' trials. */
typedef struct {
    unsigned distinct, lo, hi;
    uint8_t used[256];
} bucket_values;

static void find_values(const uint32_t h[256], bucket_values *bv) {
    unsigned d = 0;
    for (unsigned v = 0; v < 256; v++) {
        bv->used[d] = (uint8_t)v;
        d += h[v] > 0;
    }
    bv->distinct = d;
    bv->lo = d ? bv->used[0] : 256;
    bv->hi = d ? bv->used[d - 1] : 0;
}

/* cls[c] = how many of f[0..count) + add have bit length c (c < 14; every value < 2^13).  The
 * bit lengths first (independent), then four interleaved counters: most values share a class,
 * and one counter would chain its increments through memory. */
static void class_counts(const uint16_t *f, unsigned count, unsigned add, unsigned cls[14]) {
    uint8_t len[256 + 3];
    unsigned c4[4][16] = {{0}};
    for (unsigned v = 0; v < count; v++) len[v] = (uint8_t)bit_length((uint32_t)f[v] + add);
    len[count] = len[count + 1] = len[count + 2] = 15; /* a spare class past the 14 */
    for (unsigned v = 0; v < count; v += 4) {
        c4[0][len[v]]++, c4[1][len[v + 1]]++, c4[2][len[v + 2]]++, c4[3][len[v + 3]]++;
    }
    for (unsigned c = 0; c < 14; c++) cls[c] = c4[0][c] + c4[1][c] + c4[2][c] + c4[3][c];
}

/* Sum of eg_bits(f[v], g) over f[0..count) (each f < 2^12): 2 bitlen(f + 2^g) - g - 1 each. */
static unsigned code_bits_eg(const uint16_t *f, unsigned count, unsigned g) {
    unsigned cls[14], bits = 0;
    class_counts(f, count, 1u << g, cls);
    for (unsigned c = 0; c < 14; c++) bits += cls[c] * c;
    return 2 * bits - count * (g + 1);
}

/* The cheapest table with unit 2^shift for a bucket of m >= 1 bytes with histogram h and values
 * bv (exact bits of the table and of the code lengths; the rANS stream matches the latter to
 * within its states' slack). */
static void plan_bucket_table(const uint32_t h[256], const bucket_values *bv, size_t m,
                              unsigned shift, bucket_table *t) {
    unsigned distinct = bv->distinct, lo = bv->lo, hi = bv->hi;
    if (distinct == 1) {
        t->kind = TAB_SINGLE;
        t->value = (uint8_t)lo;
        fill_single(t->freq, lo, shift);
        t->bits = 16 + (double)m * (PROB_BITS - ckz_rans_log2[SCALE - (1u << shift)]);
        return;
    }
    t->kind = TAB_UNIFORM;
    t->bits = 8 + 8.0 * (double)m;
    uint16_t f[256];
    unsigned prec = PROB_BITS - shift;
    normalize_bucket(h, bv->used, distinct, m, prec, f);
    double bits = 0; /* code_bits over the used values, in the same order */
    for (unsigned j = 0; j < distinct; j++) {
        unsigned v = bv->used[j];
        bits += (double)h[v] * (prec - ckz_rans_log2[f[v]]);
    }
    if (bits + 24 < t->bits) {
        /* The order: the best for the codes' length classes (a code of u costs
         * 2 max(bitlen u, g + 1) - g - 1 bits, or 2 more when u + 2^g carries into a new
         * length), then the exact size for that order. */
        unsigned cls[14], best_g = 0, best = ~0u;
        class_counts(f + lo, hi - lo + 1, 0, cls);
        for (unsigned g = 0; g <= MAX_ORDER; g++) {
            unsigned tb = 0;
            for (unsigned c = 0; c < 14; c++)
                tb += cls[c] * (2 * (c > g + 1 ? c : g + 1) - g - 1);
            if (tb < best) best = tb, best_g = g;
        }
        best = code_bits_eg(f + lo, hi - lo + 1, best_g);
        bits += 24 + 8.0 * ((best + 7) / 8);
        if (bits < t->bits) {
            t->kind = TAB_CODED;
            t->order = (uint8_t)best_g;
            t->bits = bits;
            for (unsigned v = 0; v < 256; v++) t->freq[v] = (uint16_t)(f[v] << shift);
            return;
        }
    }
    fill_uniform(t->freq);
}

static size_t put_bucket_table(const bucket_table *t, unsigned shift, uint8_t *out) {
    uint8_t *o = out;
    if (t->kind != TAB_CODED) {
        *o++ = t->kind;
        if (t->kind == TAB_SINGLE) *o++ = t->value;
        return (size_t)(o - out);
    }
    unsigned lo, hi, g = t->order;
    ckz_used_range(t->freq, sizeof t->freq[0], &lo, &hi);
    *o++ = (uint8_t)(TAB_CODED | g << 2);
    *o++ = (uint8_t)lo;
    *o++ = (uint8_t)(hi - lo);
    uint64_t acc = 0; /* bits not yet stored, LSB first; < 8 + 2 * 13 bits between flushes */
    unsigned nacc = 0;
    for (unsigned v = lo; v <= hi; v++) {
        uint32_t w = (uint32_t)(t->freq[v] >> shift) + (1u << g);
        unsigned nb = bit_length(w), zeros = nb - g - 1;
        nacc += zeros; /* the zeros are already in acc */
        for (unsigned j = nb; j-- > 0;) acc |= (uint64_t)((w >> j) & 1) << nacc++; /* MSB first */
        while (nacc >= 8) *o++ = (uint8_t)acc, acc >>= 8, nacc -= 8;
    }
    if (nacc) *o++ = (uint8_t)acc;
    return (size_t)(o - out);
}

/* Reads and validates one bucket table (unit 2^shift) from [*p, end) into freq (summing to
 * SCALE, every frequency a multiple of 2^shift). */
static int get_bucket_table(const uint8_t **pp, const uint8_t *end, unsigned shift,
                            uint16_t freq[256], unsigned plane, unsigned b, ckz_err *err) {
    const uint8_t *p = *pp;
    if (p == end) return ckz_fail(err, "plane %u: truncated in the table of bucket %u", plane, b);
    unsigned tag = *p++, kind = tag & 3;
    if (kind == TAB_UNIFORM || kind == TAB_SINGLE) {
        if (tag >> 2)
            return ckz_fail(err, "plane %u bucket %u: table tag 0x%02x has stray bits", plane, b,
                            tag);
        if (kind == TAB_UNIFORM) {
            fill_uniform(freq);
        } else {
            if (p == end)
                return ckz_fail(err, "plane %u: truncated in the table of bucket %u", plane, b);
            fill_single(freq, *p++, shift);
        }
        *pp = p;
        return 0;
    }
    if (kind != TAB_CODED || (tag >> 5))
        return ckz_fail(err, "plane %u bucket %u: table tag 0x%02x is unknown", plane, b, tag);
    unsigned g = (tag >> 2) & 7;
    if ((size_t)(end - p) < 2)
        return ckz_fail(err, "plane %u: truncated in the table of bucket %u", plane, b);
    unsigned lo = p[0], count = (unsigned)p[1] + 1;
    p += 2;
    if (lo + count > 256)
        return ckz_fail(err, "plane %u bucket %u: table symbols %u..%u exceed 255", plane, b, lo,
                        lo + count - 1);
    memset(freq, 0, 256 * sizeof freq[0]);
    size_t avail_bits = 8 * (size_t)(end - p), pos = 0; /* bit position from p */
#define GET_BIT(bit)                                                                           \
    do {                                                                                       \
        if (pos >= avail_bits)                                                                 \
            return ckz_fail(err, "plane %u: truncated in the table of bucket %u", plane, b);   \
        (bit) = (p[pos >> 3] >> (pos & 7)) & 1u;                                               \
        pos++;                                                                                 \
    } while (0)
    uint32_t sum = 0; /* <= 256 * (2^12 - 1) */
    unsigned used = 0;
    for (unsigned j = 0; j < count; j++) {
        unsigned zeros = 0, bit;
        uint32_t w = 1;
        if ((pos >> 3) + 8 <= (size_t)(end - p)) {
            /* Fast path, 8 bytes in hand: >= 57 bits, and a code has at most 2 EG_MAX_ZEROS +
             * 1 + MAX_ORDER = 32.  The sequence is LSB first, so the zeros are the trailing
             * zeros, and w's bits after its leading 1 come lowest first: reversed. */
            uint64_t bits = ckz_load64(p + (pos >> 3)) >> (pos & 7);
            if (!(bits & ((2u << EG_MAX_ZEROS) - 1)))
                return ckz_fail(err, "plane %u bucket %u: frequency code too long", plane, b);
            zeros = (unsigned)__builtin_ctzll(bits);
            unsigned rest = zeros + g;
            uint32_t field = (uint32_t)(bits >> (zeros + 1)) & ((1u << rest) - 1), rev = 0;
            for (unsigned r = 0; r < rest; r++) rev = rev << 1 | ((field >> r) & 1u);
            w = (1u << rest) | rev;
            pos += zeros + 1 + rest;
        } else {
            for (;;) {
                GET_BIT(bit);
                if (bit) break;
                if (++zeros > EG_MAX_ZEROS)
                    return ckz_fail(err, "plane %u bucket %u: frequency code too long", plane,
                                    b);
            }
            for (unsigned r = 0; r < zeros + g; r++) {
                GET_BIT(bit);
                w = w << 1 | bit;
            }
        }
        uint32_t u = w - (1u << g); /* w >= 2^g: its top bit is at position zeros + g */
        if (u >= SCALE >> shift)
            return ckz_fail(err, "plane %u bucket %u: symbol %u has frequency %u >= %u", plane, b,
                            lo + j, u << shift, SCALE);
        freq[lo + j] = (uint16_t)(u << shift);
        sum += u << shift;
        used += u > 0;
    }
    /* The padding: the rest of the last byte, all zero. */
    while (pos & 7) {
        unsigned bit;
        GET_BIT(bit);
        if (bit) return ckz_fail(err, "plane %u bucket %u: table padding not zero", plane, b);
    }
#undef GET_BIT
    if (!freq[lo] || !freq[lo + count - 1])
        return ckz_fail(err, "plane %u bucket %u: table not in canonical form", plane, b);
    if (used < 2 || sum != SCALE)
        return ckz_fail(err, "plane %u bucket %u: table has %u symbols with frequency sum %u, "
                        "need >= 2 summing to %u", plane, b, used, sum, SCALE);
    *pp = p + pos / 8;
    return 0;
}

/* ---- encoder -------------------------------------------------------------------------------- */

/* Format 4's escape symbol: the top two bytes' value v < ESCAPE is coded as the symbol v, a
 * larger one as ESCAPE and v - ESCAPE in the escapes' two planes. */
#define ESCAPE 255u
/* ... while at most 1 / MAX_ESCAPES_DEN of a chunk's elements escape (else format 3: escapes,
 * coded order 0, would cost more than the bucketed high plane they replace). */
#define MAX_ESCAPES_DEN 4
/* States of a RANS32 stream, in bytes (the size estimates' fixed part). */
#define STATE_BYTES CKZ_RANS32_STATE_BYTES
#define UNIT_SAVE_PER_MILLE 1
/* Units the encoder tries: 2^0 paid < 0.1 % over 2^1 on real deltas, for 4x larger decode
 * tables (the decoder takes any).  Format 4 tries 2^1 alone: on the GPT deltas the coarser
 * units were kept in 0-4 chunks of 24 per set for at most 0.013 % of bytes, and their trials
 * took a sixth of the encoder's time (encode 1.20-1.30x without them, decode within 2 %). */
#define MIN_TRIED_SHIFT 1
#define FORMAT4_MAX_SHIFT MIN_TRIED_SHIFT

typedef struct {
    uint8_t mode, value, shift;                 /* shift: BUCKETED's unit 2^shift */
    uint16_t freq[256];                         /* RANS32: the one table */
    bucket_table tab[MAX_SHIFT + 1][CKZ_CTX_MAX_BUCKETS]; /* BUCKETED: [shift][bucket] */
} plane_plan;

/* Picks the plane's mode by computed sizes: RAW, CONST, one table (RANS32) or one per bucket. */
static void plan_plane(const uint8_t *s, const uint8_t *bk, size_t n, const buckets *bs,
                       unsigned max_shift, uint32_t *hist, uint32_t *spare, plane_plan *pl) {
    pl->mode = CKZ_MODE_RAW;
    if (!n || ckz_looks_like_noise(s, n)) return;
    unsigned B = bs->count;
    ckz_hist_buckets(s, bk, n, B, bs->size, hist, spare);
    uint32_t all[256];
    uint64_t total[256];
    unsigned distinct = 0, lo = 256, hi = 0;
    for (unsigned v = 0; v < 256; v++) {
        uint32_t c = 0;
        for (unsigned b = 0; b < B; b++) c += hist[b * 256 + v];
        all[v] = c, total[v] = c;
        if (c) distinct++, hi = v, lo = lo < v ? lo : v, pl->value = (uint8_t)v;
    }
    if (distinct == 1) {
        pl->mode = CKZ_MODE_CONST;
        return;
    }
    /* bytes a coded plane must stay below (as format 1's segments, stream.h) */
    double raw = (double)n * CKZ_CODED_NUM / CKZ_CODED_DEN;
    ckz_rans_normalize(total, n, pl->freq);
    double one = (double)ckz_rans_table_size(pl->freq) + STATE_BYTES +
                 code_bits(all, lo, hi, pl->freq, PROB_BITS) / 8;
    /* One table per bucket, all in the unit 2^shift that costs least.  A coarser unit (smaller
     * decode tables) is kept unless a finer one saves UNIT_SAVE_PER_MILLE of the plane. */
    double per_bucket = HUGE_VAL;
    bucket_values bv[CKZ_CTX_MAX_BUCKETS];
    unsigned found = 0; /* buckets whose values are known (trials stop early past raw) */
    for (unsigned s = max_shift + 1; s-- > MIN_TRIED_SHIFT;) {
        double size = 1 + STATE_BYTES;
        for (unsigned b = 0; b < B && size < raw; b++) {
            if (b == found) find_values(hist + b * 256, &bv[found++]);
            plan_bucket_table(hist + b * 256, &bv[b], bs->size[b], s, &pl->tab[s][b]);
            size += pl->tab[s][b].bits / 8;
        }
        if (size * 1000 < per_bucket * (1000 - UNIT_SAVE_PER_MILLE))
            per_bucket = size, pl->shift = (uint8_t)s;
    }
    if (one < raw && one <= per_bucket) pl->mode = CKZ_MODE_RANS32;
    else if (per_bucket < raw) pl->mode = CKZ_CTX_MODE_BUCKETED;
}

/* Format 4's bucketed plane, HALVES: the tables (tables[0..tlen)), the byte length of the first
 * stream as a varint, then two RANS32 streams with those tables, of the elements [0, n/2) and
 * [n/2, n) (the decoder runs the halves' state chains together).  The first stream waits in
 * hold (ckz_rans32_scratch_size(n) bytes) while the second is coded.  RAW when that is no
 * smaller.  Returns the plane's length, 0 when the rANS workspace cannot be allocated; out NULL:
 * the length only. */
static size_t put_halves(const uint8_t *s, const uint8_t *bk, size_t n, unsigned B,
                         const uint16_t (*freq)[256], const uint8_t *tables, size_t tlen,
                         uint8_t *scratch, uint8_t *hold, uint8_t *out) {
    size_t h = n / 2, size[2];
    const uint8_t *start[2];
    if (ckz_rans32_encode_tab(s, bk, h, freq, B, scratch, &start[0], &size[0])) return 0;
    memcpy(hold, start[0], size[0]);
    if (ckz_rans32_encode_tab(s + h, bk + h, n - h, freq, B, scratch, &start[1], &size[1]))
        return 0;
    size_t body = tlen + ckz_varint_size(size[0]) + size[0] + size[1];
    size_t len = 1 + ckz_varint_size(body) + body;
    if (len < 1 + n) {
        if (out) {
            uint8_t *o = out;
            *o++ = CKZ_CTX_MODE_HALVES;
            o += ckz_put_varint(o, body);
            memcpy(o, tables, tlen);
            o += tlen;
            o += ckz_put_varint(o, size[0]);
            memcpy(o, hold, size[0]);
            memcpy(o + size[0], start[1], size[1]);
        }
        return len;
    }
    if (out) {
        out[0] = CKZ_MODE_RAW;
        memcpy(out + 1, s, n);
    }
    return 1 + n;
}

/* Writes a planned plane (mode, value or body length, body) at o; returns its length, or 0 when
 * the RANS32 workspace cannot be allocated.  A coded plane whose stream ends up no smaller than
 * RAW (the estimate is off by the states' slack) is written RAW after all.  out NULL: the length
 * only (a coded plane is still coded in scratch: its exact length is known only then). */
static size_t put_plane(const uint8_t *s, const uint8_t *bk, size_t n, const buckets *bs,
                        const plane_plan *pl, uint8_t *hold, uint16_t (*freq)[256],
                        uint8_t *scratch, uint8_t *out) {
    uint8_t *o = out;
    if (pl->mode == CKZ_MODE_CONST) {
        if (o) o[0] = CKZ_MODE_CONST, o[1] = pl->value;
        return 2;
    }
    if (pl->mode != CKZ_MODE_RAW) {
        uint8_t tables[1 + CKZ_CTX_MAX_BUCKETS * (3 + 256 * 2)];
        size_t tlen = 0, size;
        const uint8_t *start;
        if (pl->mode == CKZ_MODE_RANS32) {
            tlen = ckz_rans_write_table(pl->freq, tables);
            ckz_rans32_encode(s, n, pl->freq, scratch, &start, &size);
        } else {
            tables[tlen++] = pl->shift;
            for (unsigned b = 0; b < bs->count; b++) {
                const bucket_table *t = &pl->tab[pl->shift][b];
                tlen += put_bucket_table(t, pl->shift, tables + tlen);
                memcpy(freq[b], t->freq, sizeof freq[b]);
            }
            if (hold) return put_halves(s, bk, n, bs->count, (const uint16_t (*)[256])freq,
                                        tables, tlen, scratch, hold, out);
            if (ckz_rans32_encode_tab(s, bk, n, (const uint16_t (*)[256])freq, bs->count, scratch,
                                      &start, &size))
                return 0;
        }
        size_t body = tlen + size;
        if (1 + ckz_varint_size(body) + body < 1 + n) {
            if (!o) return 1 + ckz_varint_size(body) + body;
            *o++ = pl->mode;
            o += ckz_put_varint(o, body);
            memcpy(o, tables, tlen);
            memcpy(o + tlen, start, size);
            return (size_t)(o - out) + body;
        }
    }
    if (o) {
        *o++ = CKZ_MODE_RAW;
        memcpy(o, s, n);
    }
    return 1 + n;
}

#if defined(__x86_64__) && defined(__SSE2__)
/* 0xff in byte j when element j of a 16-element block escapes: its top two bytes hold ESCAPE or
 * more (encoder: lo, hi planes) or its symbol is ESCAPE (decoder: hi NULL). */
CKZ_INLINE __m128i escape_bytes16(const uint8_t *lo, const uint8_t *hi) {
    __m128i all = _mm_set1_epi8(-1);
    __m128i e = _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)lo), all);
    if (hi) {
        __m128i h = _mm_loadu_si128((const __m128i *)hi);
        e = _mm_or_si128(e, _mm_xor_si128(_mm_cmpeq_epi8(h, _mm_setzero_si128()), all));
    }
    return e;
}
#endif

/* Bit j set when element j of a 16-element block escapes (as escape_bytes16). */
CKZ_INLINE unsigned escape_mask16(const uint8_t *lo, const uint8_t *hi) {
#if defined(__x86_64__) && defined(__SSE2__)
    return (unsigned)_mm_movemask_epi8(escape_bytes16(lo, hi));
#else
    unsigned mask = 0;
    for (unsigned j = 0; j < 16; j++)
        mask |= (unsigned)(lo[j] == ESCAPE || (hi && hi[j])) << j;
    return mask;
#endif
}

/* Elements of n whose top two bytes (encoder) or symbol (decoder: hi NULL) escape: byte counters
 * summed every 255 blocks (no popcount instruction in the baseline). */
static size_t count_escapes(const uint8_t *lo, const uint8_t *hi, size_t n) {
    size_t m = 0, i = 0;
#if defined(__x86_64__) && defined(__SSE2__)
    while (i + 16 <= n) {
        __m128i acc = _mm_setzero_si128();
        for (unsigned k = 0; k < 255 && i + 16 <= n; k++, i += 16)
            acc = _mm_sub_epi8(acc, escape_bytes16(lo + i, hi ? hi + i : NULL));
        __m128i sums = _mm_sad_epu8(acc, _mm_setzero_si128());
        m += (size_t)_mm_cvtsi128_si64(sums) + (size_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(sums, sums));
    }
#endif
    for (; i < n; i++) m += lo[i] == ESCAPE || (hi && hi[i]);
    return m;
}

/* Format 4's escapes: every element whose top two bytes (lo, hi planes) hold v >= ESCAPE gets
 * the symbol ESCAPE in lo, and v - ESCAPE goes to the escapes, its low byte to esc_lo and its
 * high byte to esc_hi, in element order.  Blocks of 16 without one are passed over. */
#if CKZ_DISPATCH
/* 64 elements a step: the escape mask by two compares, the escapes' bytes (v - ESCAPE: low byte
 * lo + 1, high byte hi - 1 unless lo is ESCAPE) out by byte compresses, ESCAPE blended into lo.
 * Returns the elements done (whole steps); *m receives the escapes taken. */
CKZ_TARGET_VBMI2 static size_t
take_escapes_vbmi2(uint8_t *lo, const uint8_t *hi, size_t n, uint8_t *esc_lo,
                   uint8_t *esc_hi, size_t *m) {
    const __m512i all = _mm512_set1_epi8(-1), one = _mm512_set1_epi8(1);
    size_t i = 0, k = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i l = _mm512_loadu_si512(lo + i), h = _mm512_loadu_si512(hi + i);
        __mmask64 full = _mm512_cmpeq_epi8_mask(l, all);
        __mmask64 esc = full | _mm512_test_epi8_mask(h, h);
        if (!esc) continue;
        __m512i el = _mm512_add_epi8(l, one), eh = _mm512_mask_sub_epi8(h, ~full, h, one);
        _mm512_mask_compressstoreu_epi8(esc_lo + k, esc, el);
        _mm512_mask_compressstoreu_epi8(esc_hi + k, esc, eh);
        _mm512_storeu_si512(lo + i, _mm512_mask_blend_epi8(esc, l, all));
        k += (size_t)__builtin_popcountll(esc);
    }
    *m = k;
    return i;
}
/* Format 4 for 2-byte words without rotation, from the words themselves (no plane split): the
 * symbols min(t, 255) to sym, and the escapes' bytes, 64 words a step.  Returns the words done
 * (whole steps); *m receives the escapes taken. */
CKZ_TARGET_VBMI2 static size_t
take_words2_vbmi2(const uint8_t *src, size_t n, uint8_t *sym, uint8_t *esc_lo,
                  uint8_t *esc_hi, size_t *m) {
    const __m512i cap = _mm512_set1_epi16(ESCAPE);
    size_t i = 0, k = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i w0 = _mm512_loadu_si512(src + 2 * i), w1 = _mm512_loadu_si512(src + 2 * i + 64);
        __m512i s = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_min_epu16(w0, cap))),
            _mm512_cvtepi16_epi8(_mm512_min_epu16(w1, cap)), 1);
        _mm512_storeu_si512(sym + i, s);
        __mmask64 esc = (__mmask64)_mm512_cmpge_epu16_mask(w0, cap) |
                        (__mmask64)_mm512_cmpge_epu16_mask(w1, cap) << 32;
        if (!esc) continue;
        __m512i e0 = _mm512_sub_epi16(w0, cap), e1 = _mm512_sub_epi16(w1, cap);
        __m512i el = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(e0)),
                                        _mm512_cvtepi16_epi8(e1), 1);
        __m512i eh = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(e0, 8))),
            _mm512_cvtepi16_epi8(_mm512_srli_epi16(e1, 8)), 1);
        _mm512_mask_compressstoreu_epi8(esc_lo + k, esc, el);
        _mm512_mask_compressstoreu_epi8(esc_hi + k, esc, eh);
        k += (size_t)__builtin_popcountll(esc);
    }
    *m = k;
    return i;
}

/* The same for 4-byte words: bytes 0 and 1 to the planes p0, p1 as a split would, the top two
 * bytes to the symbols and escapes, 64 words a step. */
CKZ_TARGET_VBMI2 static size_t
take_words4_vbmi2(const uint8_t *src, size_t n, uint8_t *p0, uint8_t *p1,
                  uint8_t *sym, uint8_t *esc_lo, uint8_t *esc_hi, size_t *m) {
    const __m512i cap = _mm512_set1_epi32(ESCAPE);
    size_t i = 0, k = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i b0[4], b1[4], sv[4], el[4], eh[4];
        __mmask64 esc = 0;
        for (unsigned q = 0; q < 4; q++) {
            __m512i w = _mm512_loadu_si512(src + 4 * (i + 16 * q));
            __m512i t = _mm512_srli_epi32(w, 16), e = _mm512_sub_epi32(t, cap);
            b0[q] = _mm512_cvtepi32_epi8(w);
            b1[q] = _mm512_cvtepi32_epi8(_mm512_srli_epi32(w, 8));
            sv[q] = _mm512_cvtepi32_epi8(_mm512_min_epu32(t, cap));
            el[q] = _mm512_cvtepi32_epi8(e);
            eh[q] = _mm512_cvtepi32_epi8(_mm512_srli_epi32(e, 8));
            esc |= (__mmask64)_mm512_cmpge_epu32_mask(t, cap) << (16 * q);
        }
#define JOIN4(v) _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(v[1], v[0])),     \
                                    _mm256_set_m128i(v[3], v[2]), 1)
        _mm512_storeu_si512(p0 + i, JOIN4(b0));
        _mm512_storeu_si512(p1 + i, JOIN4(b1));
        _mm512_storeu_si512(sym + i, JOIN4(sv));
        if (esc) {
            _mm512_mask_compressstoreu_epi8(esc_lo + k, esc, JOIN4(el));
            _mm512_mask_compressstoreu_epi8(esc_hi + k, esc, JOIN4(eh));
            k += (size_t)__builtin_popcountll(esc);
        }
#undef JOIN4
    }
    *m = k;
    return i;
}

/* Byte shuffles that move the escapes of 8 elements between their lanes and the escape planes
 * (filled once by ckz_ctx_init).  For an 8-bit mask of the lanes that escape, with e_j lane j's
 * 16-bit escape value and r_j its rank among the escaping lanes:
 *   esc_pack[mask]:   8 words e_j (16 bytes) -> bytes r_j = e_j's low byte, 8 + r_j = its high
 *                     byte, in lane order (the next low and high bytes of the planes);
 *   esc_unpack[mask]: the next 8 low bytes | the next 8 high bytes -> word j = e_j, 0 in the
 *                     lanes that do not escape. */
static uint8_t esc_pack[256][16], esc_unpack[256][16];

/* The AVX2 forms of take_words2_vbmi2 and take_words4_vbmi2, 32 words a step: the symbols by
 * saturating packs (which interleave 128-bit lanes, undone by one dword permute), the escapes
 * (3-12% of the elements on the GPT's deltas) packed 8 lanes at a time by byte shuffles
 * (esc_pack), each group storing 8 bytes to each plane of which the escapes keep theirs.  The
 * planes hold n bytes each, so the stores stay inside while m + 32 <= n; past that (a chunk that
 * nearly all escapes) the step's escapes go one by one. */
CKZ_INLINE void take_step_escapes(const uint8_t *src, unsigned width, size_t i, uint32_t mask,
                                  uint8_t *esc_lo, uint8_t *esc_hi, size_t *m) {
    for (; mask; mask &= mask - 1) {
        size_t j = i + (unsigned)__builtin_ctz(mask);
        unsigned e = (width == 2 ? ckz_load16(src + 2 * j) : ckz_load32(src + 4 * j) >> 16) -
                     ESCAPE;
        esc_lo[*m] = (uint8_t)e, esc_hi[*m] = (uint8_t)(e >> 8), ++*m;
    }
}

/* Group g's escapes (mask bits 8g .. 8g + 7) from e, its 8 words' values t - ESCAPE (any value in
 * the lanes that do not escape), to the planes at *m. */
#define PACK_GROUP(e, mask, g)                                                                 \
    do {                                                                                       \
        unsigned bits_ = (mask) >> (8 * (g)) & 0xff;                                           \
        __m128i b_ = _mm_shuffle_epi8((e), _mm_loadu_si128((const __m128i *)esc_pack[bits_])); \
        _mm_storel_epi64((__m128i *)(esc_lo + k), b_);                                         \
        _mm_storel_epi64((__m128i *)(esc_hi + k), _mm_unpackhi_epi64(b_, b_));                 \
        k += (size_t)__builtin_popcount(bits_);                                                \
    } while (0)

CKZ_TARGET_V3 static size_t
take_words2_v3(const uint8_t *src, size_t n, uint8_t *sym, uint8_t *esc_lo,
               uint8_t *esc_hi, size_t *m) {
    const __m256i cap = _mm256_set1_epi16(ESCAPE), all = _mm256_set1_epi8(-1);
    size_t i = 0, k = *m;
    for (; i + 32 <= n; i += 32) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(src + 2 * i));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(src + 2 * i + 32));
        __m256i v = _mm256_packus_epi16(_mm256_min_epu16(w0, cap), _mm256_min_epu16(w1, cap));
        v = _mm256_permute4x64_epi64(v, 0xd8); /* qwords 0, 2, 1, 3: the words' order */
        _mm256_storeu_si256((__m256i *)(sym + i), v);
        uint32_t esc = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, all));
        if (k + 32 > n) { /* else branch-free: whether a step escapes is hard to predict */
            take_step_escapes(src, 2, i, esc, esc_lo, esc_hi, &k);
            continue;
        }
        __m256i e0 = _mm256_sub_epi16(w0, cap), e1 = _mm256_sub_epi16(w1, cap);
        PACK_GROUP(_mm256_castsi256_si128(e0), esc, 0);
        PACK_GROUP(_mm256_extracti128_si256(e0, 1), esc, 1);
        PACK_GROUP(_mm256_castsi256_si128(e1), esc, 2);
        PACK_GROUP(_mm256_extracti128_si256(e1, 1), esc, 3);
    }
    *m = k;
    return i;
}

CKZ_TARGET_V3 static size_t take_words4_v3(const uint8_t *src, size_t n, uint8_t *p0,
                                           uint8_t *p1, uint8_t *sym, uint8_t *esc_lo,
                                           uint8_t *esc_hi, size_t *m) {
    const __m256i cap = _mm256_set1_epi16(ESCAPE), all = _mm256_set1_epi8(-1);
    const __m256i cap32 = _mm256_set1_epi32(ESCAPE);
    const __m256i low16 = _mm256_set1_epi32(0xffff), low8 = _mm256_set1_epi16(0xff);
    /* after two packs, dword k of 128-bit lane h holds elements 8k + 4h .. 8k + 4h + 3 */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0, k = *m;
    for (; i + 32 <= n; i += 32) {
        __m256i w[4], lo[2], top[2];
        for (unsigned q = 0; q < 4; q++)
            w[q] = _mm256_loadu_si256((const __m256i *)(src + 4 * i + 32 * q));
        for (unsigned h = 0; h < 2; h++) {
            lo[h] = _mm256_packus_epi32(_mm256_and_si256(w[2 * h], low16),
                                        _mm256_and_si256(w[2 * h + 1], low16));
            top[h] = _mm256_min_epu16(_mm256_packus_epi32(_mm256_srli_epi32(w[2 * h], 16),
                                                          _mm256_srli_epi32(w[2 * h + 1], 16)),
                                      cap);
        }
        __m256i b0 = _mm256_packus_epi16(_mm256_and_si256(lo[0], low8),
                                         _mm256_and_si256(lo[1], low8));
        __m256i b1 = _mm256_packus_epi16(_mm256_srli_epi16(lo[0], 8), _mm256_srli_epi16(lo[1], 8));
        __m256i v = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(top[0], top[1]), order);
        _mm256_storeu_si256((__m256i *)(p0 + i), _mm256_permutevar8x32_epi32(b0, order));
        _mm256_storeu_si256((__m256i *)(p1 + i), _mm256_permutevar8x32_epi32(b1, order));
        _mm256_storeu_si256((__m256i *)(sym + i), v);
        uint32_t esc = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, all));
        if (k + 32 > n) { /* else branch-free: whether a step escapes is hard to predict */
            take_step_escapes(src, 4, i, esc, esc_lo, esc_hi, &k);
            continue;
        }
        for (unsigned q = 0; q < 4; q++) {
            /* t - ESCAPE of elements 8q .. 8q + 7 as words (an escape's fits 16 bits; the
             * others saturate and are not kept) */
            __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(w[q], 16), cap32);
            __m128i e16 = _mm_packus_epi32(_mm256_castsi256_si128(e),
                                           _mm256_extracti128_si256(e, 1));
            PACK_GROUP(e16, esc, q);
        }
    }
    *m = k;
    return i;
}
#undef PACK_GROUP
#endif

void ckz_ctx_init(void) {
#if CKZ_DISPATCH
    for (unsigned mask = 0; mask < 256; mask++) {
        memset(esc_pack[mask], 0x80, 16);
        memset(esc_unpack[mask], 0x80, 16);
        for (unsigned j = 0, r = 0; j < 8; j++)
            if (mask >> j & 1) {
                esc_pack[mask][r] = (uint8_t)(2 * j);
                esc_pack[mask][8 + r] = (uint8_t)(2 * j + 1);
                esc_unpack[mask][2 * j] = (uint8_t)r;
                esc_unpack[mask][2 * j + 1] = (uint8_t)(8 + r);
                r++;
            }
    }
#endif
}

static void take_escapes(uint8_t *lo, const uint8_t *hi, size_t n, uint8_t *esc_lo,
                         uint8_t *esc_hi) {
    size_t m = 0, start = 0;
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(VBMI2)) start = take_escapes_vbmi2(lo, hi, n, esc_lo, esc_hi, &m);
#endif
    for (size_t i = start; i < n; i += 16) {
        unsigned mask = i + 16 <= n ? escape_mask16(lo + i, hi + i) : 0;
        if (i + 16 > n)
            for (size_t j = i; j < n; j++) mask |= (unsigned)(lo[j] == ESCAPE || hi[j]) << (j - i);
        for (; mask; mask &= mask - 1) {
            size_t j = i + (unsigned)__builtin_ctz(mask);
            unsigned e = (lo[j] | (unsigned)hi[j] << 8) - ESCAPE;
            esc_lo[m] = (uint8_t)e, esc_hi[m] = (uint8_t)(e >> 8), m++;
            lo[j] = ESCAPE;
        }
    }
}

size_t ckz_encode_ctx_bound(size_t n, unsigned elem_size) {
    /* format 4: the bucket starts, two escape planes of at most n / 4 bytes in the place of
     * the top plane, and HALVES planes no larger than RAW ones */
    return CKZ_CTX_HEADER + CKZ_CTX_MAX_BUCKETS + (size_t)(elem_size + 1) * CKZ_SEGMENT_OVERHEAD +
           n * elem_size;
}

int ckz_encode_planes_ctx(const uint8_t *src, const uint8_t *ctx, size_t n, unsigned elem_size,
                          unsigned rotate, unsigned format, uint8_t *out, size_t *out_len,
                          ckz_err *err) {
    size_t bytes = n * elem_size;
    buckets bs;
    find_buckets(ctx, n, &bs);
    int four = format == CKZ_CTX_FORMAT && elem_size >= 2;
    /* bucket histograms (one, and three spare copies) | the bucket tables' frequencies | the
     * plan | planes | bucket indices | format 4: the escapes' low and high bytes, zeros (their
     * bucket indices), a HALVES plane's first stream | RANS32 scratch: this thread's scratch,
     * kept from call to call (memory.h), so that chunk after chunk reuses memory already
     * faulted in. */
    size_t hist = (size_t)CKZ_CTX_MAX_BUCKETS * 256 * sizeof(uint32_t);
    size_t freqs = (size_t)CKZ_CTX_MAX_BUCKETS * 256 * sizeof(uint16_t);
    size_t rans = ckz_rans32_scratch_size(n);
    size_t total = 4 * hist + freqs + sizeof(plane_plan) + bytes + n + (four ? 3 * n + rans : 0) +
                   rans;
    uint8_t *mem = ckz_scratch_get(CKZ_SCRATCH_PLANES, total);
    if (!mem) return ckz_fail(err, "out of memory for %zu bytes of encoder scratch", total);
    uint32_t *h0 = (uint32_t *)mem, *h1 = h0 + CKZ_CTX_MAX_BUCKETS * 256;
    uint16_t (*freq)[256] = (uint16_t (*)[256])(mem + 4 * hist);
    plane_plan *pl = (plane_plan *)(mem + 4 * hist + freqs);
    uint8_t *planes = (uint8_t *)pl + sizeof(plane_plan), *bk = planes + bytes;
    uint8_t *esc_lo = bk + n, *esc_hi = esc_lo + n, *zeros = esc_hi + n, *hold = zeros + n;
    uint8_t *scratch = four ? hold + rans : esc_lo;
    /* Format 4 codes the top two planes as a symbol plane and escapes only while at most
     * 1/MAX_ESCAPES_DEN of the elements escape; else this chunk is written in format 3.  Two-
     * byte words without rotation go straight from the words to the symbols and escapes (their
     * only plane is the symbol plane); the rest are split into planes first. */
    uint8_t *top = planes + (size_t)(elem_size - 1) * n;
    size_t m = 0, taken = 0;
#if CKZ_DISPATCH
    if (four && (elem_size == 2 || elem_size == 4) && rotate == 0 && CKZ_CPU_AT(V3)) {
        uint8_t *sym = top - n; /* plane elem_size - 2 */
        if (CKZ_CPU_AT(VBMI2))
            taken = elem_size == 2
                        ? take_words2_vbmi2(src, n, sym, esc_lo, esc_hi, &m)
                        : take_words4_vbmi2(src, n, planes, planes + n, sym, esc_lo, esc_hi, &m);
        else
            taken = elem_size == 2
                        ? take_words2_v3(src, n, sym, esc_lo, esc_hi, &m)
                        : take_words4_v3(src, n, planes, planes + n, sym, esc_lo, esc_hi, &m);
        for (size_t i = taken; i < n; i++) {
            uint32_t w = elem_size == 2 ? ckz_load16(src + 2 * i) : ckz_load32(src + 4 * i);
            unsigned t = elem_size == 2 ? w : w >> 16, e = t - ESCAPE;
            if (elem_size == 4) planes[i] = (uint8_t)w, planes[n + i] = (uint8_t)(w >> 8);
            sym[i] = (uint8_t)(t < ESCAPE ? t : ESCAPE);
            if (t >= ESCAPE) esc_lo[m] = (uint8_t)e, esc_hi[m++] = (uint8_t)(e >> 8);
        }
        taken = n;
    }
#endif
    if (taken && m * MAX_ESCAPES_DEN > n) four = 0, scratch = esc_lo, taken = 0;
    if (!taken) {
        ckz_split_planes(src, planes, n, elem_size, rotate);
        if (four) m = count_escapes(top - n, top, n);
        if (four && m * MAX_ESCAPES_DEN > n) four = 0, scratch = esc_lo;
    }
    bucket_index(ctx, n, bs.first, bs.count, bk);
    size_t size = 1 + ckz_varint_size(n) + 1 + ckz_varint_size(bs.count);
    if (four) size += bs.count ? bs.count - 1 : 0; /* the bucket starts */
    if (out) {
        uint8_t *o = out;
        *o++ = four ? CKZ_CTX_FORMAT : CKZ_CTX_FORMAT3;
        o += ckz_put_varint(o, n);
        *o++ = (uint8_t)elem_size;
        o += ckz_put_varint(o, bs.count);
        if (four)
            for (unsigned b = 1; b < bs.count; b++) *o++ = bs.first[b];
    }
    /* Format 4: the top two planes become the symbol plane (in the lower one's place) and the
     * escapes' two planes; its bucketed planes are HALVES. */
    if (four && !taken) take_escapes(top - n, top, n, esc_lo, esc_hi);
    int rc = 0;
    for (unsigned p = 0; p < (four ? elem_size - 1 : elem_size) && !rc; p++) {
        plan_plane(planes + p * n, bk, n, &bs, four ? FORMAT4_MAX_SHIFT : MAX_SHIFT, h0, h1, pl);
        size_t len = put_plane(planes + p * n, bk, n, &bs, pl, four ? hold : NULL, freq, scratch,
                               out ? out + size : NULL);
        if (!len) rc = ckz_fail(err, "out of memory for the rans32 tables");
        size += len;
    }
    if (four) {
        /* the escapes' two planes, order 0: one bucket of all m */
        buckets one = {.count = 1};
        one.size[0] = m;
        memset(zeros, 0, m);
        const uint8_t *esc[2] = {esc_lo, esc_hi};
        for (unsigned e = 0; e < 2 && !rc; e++) {
            plan_plane(esc[e], zeros, m, &one, FORMAT4_MAX_SHIFT, h0, h1, pl);
            if (pl->mode == CKZ_CTX_MODE_BUCKETED) pl->mode = CKZ_MODE_RANS32;
            size_t len = put_plane(esc[e], zeros, m, &one, pl, NULL, freq, scratch,
                                   out ? out + size : NULL);
            if (!len) rc = ckz_fail(err, "out of memory for the rans32 tables");
            size += len;
        }
    }
    ckz_scratch_put(CKZ_SCRATCH_PLANES, mem);
    *out_len = size;
    return rc;
}

/* ---- decoder -------------------------------------------------------------------------------- */

/* Decode tables of B buckets (unit 2^shift), table b at T + b * (SCALE >> shift), entries as
 * ckz_rans_build_dtable_unit writes them (symbol | (slot - c) << 8 | f << 20).  Each symbol's run
 * is written 16 entries at a time, the last block running past the run into the next one's
 * entries, which are written after it; past the last table T needs TABLE_SLACK entries. */
#define TABLE_SLACK 16
typedef uint32_t u32x8 __attribute__((vector_size(32)));
CKZ_INLINE void build_tables_impl(const uint16_t (*freq)[256], unsigned B, unsigned shift,
                                  uint32_t *T) {
    u32x8 step0 = {0, 1, 2, 3, 4, 5, 6, 7}, step1 = step0 + 8;
    step0 *= 1u << shift << 8, step1 *= 1u << shift << 8;
    uint32_t inc = 16u << shift << 8, *t = T;
    for (unsigned b = 0; b < B; b++)
        for (unsigned v = 0; v < 256; v++) {
            uint32_t f = freq[b][v], units = f >> shift;
            if (!units) continue;
            uint32_t base = v | f << 20;
            u32x8 e0 = step0 + base, e1 = step1 + base;
            for (uint32_t j = 0; j < units; j += 16, e0 += inc, e1 += inc) {
                memcpy(t + j, &e0, sizeof e0);
                memcpy(t + j + 8, &e1, sizeof e1);
            }
            t += units;
        }
}
CKZ_VERSIONED(build_tables, (const uint16_t (*freq)[256], unsigned B, unsigned shift, uint32_t *T),
              (freq, B, shift, T))

typedef struct {
    unsigned format;
    uint64_t n;          /* elements */
    unsigned elem_size;
    uint64_t buckets;
    const uint8_t *body; /* first segment or plane */
} ctx_header;

static int parse_ctx_header(const uint8_t *src, size_t len, ctx_header *h, ckz_err *err) {
    const uint8_t *p = src, *end = src + len;
    if (!len) return ckz_fail(err, "stream is empty");
    if (!ckz_is_ctx_format(*p))
        return ckz_fail(err, "stream format byte is 0x%02x, expected 0x%02x, 0x%02x or 0x%02x "
                        "(context planes)", *p, CKZ_CTX_FORMAT, CKZ_CTX_FORMAT3,
                        CKZ_CTX_FORMAT2);
    h->format = *p++;
    if (ckz_get_varint(&p, end, &h->n, "element count", err)) return -1;
    if (p == end) return ckz_fail(err, "stream truncated in the element size");
    h->elem_size = *p++;
    if (!ckz_ctx_elem_ok(h->elem_size))
        return ckz_fail(err, "element size %u is not 1, 2, 4 or 8", h->elem_size);
    if (h->n > CKZ_MAX_DECODED / h->elem_size)
        return ckz_fail(err, "%llu elements of %u bytes exceed %llu bytes",
                        (unsigned long long)h->n, h->elem_size,
                        (unsigned long long)CKZ_MAX_DECODED);
    if (h->n > CKZ_CTX_MAX_ELEMENTS)
        return ckz_fail(err, "element count %llu exceeds %llu", (unsigned long long)h->n,
                        CKZ_CTX_MAX_ELEMENTS);
    if (ckz_get_varint(&p, end, &h->buckets, "bucket count", err)) return -1;
    if (h->buckets > CKZ_CTX_MAX_BUCKETS)
        return ckz_fail(err, "bucket count %llu exceeds %d", (unsigned long long)h->buckets,
                        CKZ_CTX_MAX_BUCKETS);
    h->body = p;
    return 0;
}

int ckz_ctx_decoded_size(const uint8_t *src, size_t len, uint64_t *n, ckz_err *err) {
    ctx_header h;
    if (parse_ctx_header(src, len, &h, err)) return -1;
    *n = h.n * h.elem_size;
    return 0;
}

static int bucket_mismatch(uint64_t stored, unsigned computed, ckz_err *err) {
    return ckz_fail(err, "stream has %llu buckets but the context gives %u (not the encoder's "
                    "context?)", (unsigned long long)stored, computed);
}

/* Format 2: segments into a bucket-ordered scratch, then one gather pass. */
static int decode_format2(const ctx_header *h, const uint8_t *end, const uint8_t *ctx, size_t n,
                          uint8_t *dst, unsigned elem_size, unsigned rotate, ckz_err *err) {
    size_t bytes = n * elem_size;
    layout *L = malloc(sizeof *L);
    uint8_t *planes = malloc(bytes ? bytes : 1); /* == dst_len: bounded by the caller's buffer */
    int rc = -1;
    if (!planes || !L) {
        ckz_fail(err, "out of memory for %zu bytes of planes", bytes);
        goto done;
    }
    plan_layout(ctx, n, L);
    if (h->buckets != L->buckets) {
        bucket_mismatch(h->buckets, L->buckets, err);
        goto done;
    }
    const uint8_t *p = h->body;
    for (unsigned q = 0; q < elem_size; q++) {
        uint8_t *o = planes + q * n;
        for (unsigned b = 0; b < L->buckets; b++) {
            if (ckz_get_segment(&p, end, o, L->size[b], q * L->buckets + b, err)) goto done;
            o += L->size[b];
        }
    }
    if (p != end) {
        ckz_fail(err, "stream has %zu trailing bytes", (size_t)(end - p));
        goto done;
    }
    switch (elem_size) {
    case 1: gather1(planes, ctx, n, rotate, L, dst); break;
    case 2: gather2(planes, ctx, n, rotate, L, dst); break;
    case 4: gather4(planes, ctx, n, rotate, L, dst); break;
    default: gather8(planes, ctx, n, rotate, L, dst); break;
    }
    rc = 0;
done:
    free(planes);
    free(L);
    return rc;
}

/* A coded plane's body length, checked against the bytes left. */
static int get_body(const uint8_t **p, const uint8_t *end, unsigned plane, size_t *len,
                    ckz_err *err) {
    uint64_t v = 0;
    if (ckz_get_varint(p, end, &v, "a plane's body length", err)) return -1;
    if (v > (uint64_t)(end - *p))
        return ckz_fail(err, "plane %u body length %llu exceeds the %zu bytes left", plane,
                        (unsigned long long)v, (size_t)(end - *p));
    *len = (size_t)v;
    return 0;
}

/* A BUCKETED plane's body at *p (its mode byte read): the body length, the unit 2^shift and the
 * B bucket tables into freq; sets the rANS stream [*stream, *stream + *stream_len) and moves *p
 * past the body. */
static int get_bucketed(const uint8_t **p, const uint8_t *end, unsigned q, unsigned B,
                        uint16_t (*freq)[256], unsigned *shift, const uint8_t **stream,
                        size_t *stream_len, ckz_err *err) {
    size_t body = 0;
    if (get_body(p, end, q, &body, err)) return -1;
    const uint8_t *t = *p, *body_end = *p + body;
    if (t == body_end) return ckz_fail(err, "plane %u: truncated in the frequency unit", q);
    *shift = *t++;
    if (*shift > MAX_SHIFT)
        return ckz_fail(err, "plane %u: frequency unit 2^%u exceeds 2^%d", q, *shift, MAX_SHIFT);
    for (unsigned b = 0; b < B; b++)
        if (get_bucket_table(&t, body_end, *shift, freq[b], q, b, err)) return -1;
    *stream = t;
    *stream_len = (size_t)(body_end - t);
    *p = body_end;
    return 0;
}

/* Format 3: each plane RAW (merged from the stream), CONST, or decoded into a scratch plane;
 * then one merge.  Two BUCKETED planes in a row decode together (ckz_rans32_decode_tab2), with
 * the same outcome and first error as one after the other. */
/* Merges the planes into dst and, with base, inverts the residual of `kind` there, in blocks
 * that stay in L1 between the two passes. */
#define MERGE_BLOCK 4096 /* elements */
static void merge_residual(const uint8_t *const *planes, uint8_t *dst, size_t n,
                           unsigned elem_size, unsigned rotate, const uint8_t *base, int kind) {
    if (!base) {
        ckz_merge_planes(planes, dst, n, elem_size, rotate);
        return;
    }
    for (size_t i = 0; i < n; i += MERGE_BLOCK) {
        size_t m = n - i < MERGE_BLOCK ? n - i : MERGE_BLOCK, at = i * elem_size;
        const uint8_t *block[8];
        for (unsigned q = 0; q < elem_size; q++) block[q] = planes[q] + i;
        ckz_merge_planes(block, dst + at, m, elem_size, rotate);
        ckz_residual_decode(dst + at, base + at, dst + at, m, elem_size, (unsigned)kind);
    }
}

/* What decoding a sequence of planes shares: the context's buckets, the bucket indices (made
 * on first use), and the scratch tables of two BUCKETED planes. */
typedef struct {
    const uint8_t *ctx;
    const buckets *bs;
    uint8_t *bk;
    int have_bk;
    uint32_t *T;           /* two planes' decode tables, span entries each */
    size_t span;
    uint16_t (*freq)[256]; /* B frequency tables */
} plane_reader;

/* Which bucketed mode read_planes takes: format 3's BUCKETED, format 4's HALVES, or neither
 * (format 4's escape planes, which are not in element order). */
enum { BUCKETED_OK = 1, HALVES_OK = 2 };

/* A bucketed plane's body at *p (its mode byte read), as get_bucketed reads it; then its decode
 * tables into r->T and, on first use, the elements' bucket indices. */
static int bucketed_head(plane_reader *r, const uint8_t **p, const uint8_t *end, unsigned q,
                         size_t n, unsigned *shift, const uint8_t **stream, size_t *stream_len,
                         ckz_err *err) {
    unsigned B = r->bs->count;
    if (get_bucketed(p, end, q, B, r->freq, shift, stream, stream_len, err)) return -1;
    build_tables((const uint16_t (*)[256])r->freq, B, *shift, r->T);
    if (!r->have_bk) bucket_index(r->ctx, n, r->bs->first, B, r->bk), r->have_bk = 1;
    return 0;
}

/* Reads `count` planes of n bytes from *p, plane i (numbered first + i in messages) into
 * out + i * n unless RAW (then plane_at[i] points into the stream).  Two BUCKETED planes in a
 * row decode together (ckz_rans32_decode_tab2), with the same outcome and first error as one
 * after the other; a HALVES plane decodes its two halves together. */
static int read_planes(plane_reader *r, const uint8_t **pp, const uint8_t *end, size_t n,
                       unsigned count, unsigned first, int bucketed_ok, uint8_t *out,
                       const uint8_t **plane_at, ckz_err *err) {
    const uint8_t *p = *pp;
    unsigned B = r->bs->count;
    for (unsigned i = 0; i < count; i++) {
        unsigned q = first + i;
        uint8_t *o = out + i * n;
        plane_at[i] = o;
        if (p == end) return ckz_fail(err, "stream truncated in the mode of plane %u", q);
        unsigned mode = *p++;
        size_t body = 0;
        if (mode == CKZ_MODE_RAW) {
            if (n > (size_t)(end - p))
                return ckz_fail(err, "stream truncated: RAW plane %u needs %zu bytes, %zu left", q,
                                n, (size_t)(end - p));
            plane_at[i] = p;
            p += n;
        } else if (mode == CKZ_MODE_CONST) {
            if (p == end) return ckz_fail(err, "stream truncated in the value of plane %u", q);
            memset(o, *p++, n);
        } else if (mode == CKZ_MODE_RANS32) {
            uint16_t one[256]; /* not freq[0]: B is 0 for n = 0 */
            size_t used = 0;
            if (get_body(&p, end, q, &body, err) ||
                ckz_rans_read_table(p, body, one, &used, err) ||
                ckz_rans32_decode(one, p + used, body - used, o, n, err))
                return -1;
            p += body;
        } else if (mode == CKZ_CTX_MODE_HALVES && bucketed_ok == HALVES_OK) {
            /* the tables, then the streams: the first half's length, the two halves' streams */
            unsigned shift;
            const uint8_t *t;
            size_t len;
            if (bucketed_head(r, &p, end, q, n, &shift, &t, &len, err)) return -1;
            const uint8_t *t_end = t + len;
            uint64_t first_len = 0;
            if (ckz_get_varint(&t, t_end, &first_len, "the first half's stream length", err))
                return -1;
            if (first_len > (uint64_t)(t_end - t))
                return ckz_fail(err, "plane %u: first half's stream of %llu bytes exceeds the "
                                "%zu left", q, (unsigned long long)first_len, (size_t)(t_end - t));
            size_t h = n / 2;
            const uint32_t *tt[2] = {r->T, r->T};
            const uint8_t *tabs[2] = {r->bk, r->bk + h}, *in[2] = {t, t + first_len};
            const unsigned shifts[2] = {shift, shift};
            const size_t lens[2] = {(size_t)first_len, (size_t)(t_end - t) - (size_t)first_len};
            uint8_t *outs[2] = {o, o + h};
            const size_t counts[2] = {h, n - h};
            if (ckz_rans32_decode_tab2x(tt, tabs, shifts, in, lens, outs, counts, err)) return -1;
        } else if (mode == CKZ_CTX_MODE_BUCKETED && bucketed_ok == BUCKETED_OK) {
            unsigned shift[2];
            const uint8_t *stream[2];
            size_t stream_len[2];
            if (bucketed_head(r, &p, end, q, n, &shift[0], &stream[0], &stream_len[0], err))
                return -1;
            /* The next plane too, when it is BUCKETED and reads without error (else it is
             * read again, and its error reported, after this plane decodes). */
            const uint8_t *next = p;
            if (i + 1 < count && next != end && *next == CKZ_CTX_MODE_BUCKETED) {
                next++;
                ckz_err spare;
                if (!get_bucketed(&next, end, q + 1, B, r->freq, &shift[1], &stream[1],
                                  &stream_len[1], &spare)) {
                    build_tables((const uint16_t (*)[256])r->freq, B, shift[1], r->T + r->span);
                    const uint32_t *tt[2] = {r->T, r->T + r->span};
                    uint8_t *outs[2] = {o, o + n};
                    plane_at[i + 1] = o + n;
                    if (ckz_rans32_decode_tab2(tt, r->bk, shift, stream, stream_len, outs, n, err))
                        return -1;
                    p = next;
                    i++;
                    continue;
                }
            }
            if (ckz_rans32_decode_tab(r->T, r->bk, shift[0], stream[0], stream_len[0], o, n, err))
                return -1;
        } else {
            return ckz_fail(err, "plane %u has unknown mode %u", q, mode);
        }
    }
    *pp = p;
    return 0;
}

#if CKZ_DISPATCH
/* The top two bytes of 64 elements from their symbols at sym (a symbol below ESCAPE is the low
 * byte, the high one 0) and, at the escape positions, ESCAPE + e for the next escapes e:
 * e's bytes expanded from the escapes' planes at *m, low byte e_lo - 1, high byte
 * e_hi + (e_lo != 0).  *over gets a bit when one passes 16 bits. */
CKZ_TARGET_VBMI2 static void
top_bytes_vbmi2(const uint8_t *sym, const uint8_t *esc_lo, const uint8_t *esc_hi,
                size_t *m, unsigned *over, __m512i *lo, __m512i *hi) {
    __m512i s = _mm512_loadu_si512(sym);
    __mmask64 esc = _mm512_cmpeq_epi8_mask(s, _mm512_set1_epi8(-1));
    *lo = s, *hi = _mm512_setzero_si512();
    if (!esc) return;
    __m512i el = _mm512_maskz_expandloadu_epi8(esc, esc_lo + *m);
    __m512i eh = _mm512_maskz_expandloadu_epi8(esc, esc_hi + *m);
    __mmask64 carry = _mm512_test_epi8_mask(el, el);
    *over |= (carry & _mm512_cmpeq_epi8_mask(eh, _mm512_set1_epi8(-1))) != 0;
    *lo = _mm512_mask_sub_epi8(s, esc, el, _mm512_set1_epi8(1));
    *hi = _mm512_maskz_mov_epi8(esc, _mm512_mask_add_epi8(eh, carry, eh, _mm512_set1_epi8(1)));
    *m += (size_t)__builtin_popcountll(esc);
}

/* restore_words' steps of 64 words for 2-byte words; returns the elements done. */
CKZ_TARGET_VBMI2 static size_t
restore_words2_vbmi2(const uint8_t *sym, size_t n, const uint8_t *esc_lo,
                     const uint8_t *esc_hi, size_t *m, unsigned *over,
                     uint8_t *dst) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i lo, hi;
        top_bytes_vbmi2(sym + i, esc_lo, esc_hi, m, over, &lo, &hi);
        /* byte j of each half to bits 0-7 and 8-15 of word j (the half an immediate) */
#define HALF(v, k) _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, k))
#define WORDS(k)                                                                               \
        _mm512_storeu_si512(dst + 2 * i + 64 * (k),                                            \
                            _mm512_or_si512(HALF(lo, k), _mm512_slli_epi16(HALF(hi, k), 8)))
        WORDS(0);
        WORDS(1);
#undef WORDS
#undef HALF
    }
    return i;
}

/* restore_words' steps of 64 words for 4-byte words: bytes 0 and 1 from the planes p0, p1, the
 * top two from the symbols and escapes; returns the elements done. */
CKZ_TARGET_VBMI2 static size_t
restore_words4_vbmi2(const uint8_t *p0, const uint8_t *p1, const uint8_t *sym,
                     size_t n, const uint8_t *esc_lo, const uint8_t *esc_hi,
                     size_t *m, unsigned *over, uint8_t *dst) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i s, h;
        top_bytes_vbmi2(sym + i, esc_lo, esc_hi, m, over, &s, &h);
        __m512i a = _mm512_loadu_si512(p0 + i), b = _mm512_loadu_si512(p1 + i);
        /* byte j of each 16-element quarter to bits 0-7, 8-15, 16-23, 24-31 of word j */
#define QUARTER(v, q) _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, q))
#define WORDS(q)                                                                               \
        _mm512_storeu_si512(                                                                   \
            dst + 4 * (i + 16 * (q)),                                                          \
            _mm512_or_si512(_mm512_or_si512(QUARTER(a, q), _mm512_slli_epi32(QUARTER(b, q), 8)), \
                            _mm512_or_si512(_mm512_slli_epi32(QUARTER(s, q), 16),             \
                                            _mm512_slli_epi32(QUARTER(h, q), 24))))
        WORDS(0);
        WORDS(1);
        WORDS(2);
        WORDS(3);
#undef WORDS
#undef QUARTER
    }
    return i;
}

/* restore_top's steps of 64 elements (lo, hi planes); returns the elements done. */
CKZ_TARGET_VBMI2 static size_t
restore_top_vbmi2(const uint8_t *sym, size_t n, const uint8_t *esc_lo,
                  const uint8_t *esc_hi, size_t *m, unsigned *over, uint8_t *lo,
                  uint8_t *hi) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i l, h;
        top_bytes_vbmi2(sym + i, esc_lo, esc_hi, m, over, &l, &h);
        _mm512_storeu_si512(lo + i, l);
        _mm512_storeu_si512(hi + i, h);
    }
    return i;
}

/* The AVX2 forms of restore_words2_vbmi2 and restore_words4_vbmi2, 32 words a step: the symbols
 * widened as if none escaped (byte unpacks interleave 128-bit lanes, put back by lane
 * permutes), then e = t - ESCAPE added to the words' top 16 bits at the escapes (a symbol
 * ESCAPE widens to t = ESCAPE): 8 lanes at a time, 8 bytes loaded from each escape plane and
 * placed by a byte shuffle (esc_unpack).  Those loads stay inside the planes while m + 32 <= mt,
 * the escapes counted; past that the step's escapes are patched in one by one.  *over gets a bit
 * when a t passes 16 bits. */
CKZ_INLINE void patch_step_escapes(uint32_t mask, unsigned width, const uint8_t *esc_lo,
                                   const uint8_t *esc_hi, size_t *m, unsigned *over,
                                   uint8_t *dst) {
    for (; mask; mask &= mask - 1) {
        unsigned j = (unsigned)__builtin_ctz(mask);
        unsigned t = ESCAPE + (esc_lo[*m] | (unsigned)esc_hi[*m] << 8);
        *over |= t >> 16, ++*m;
        uint8_t *at = dst + width * j + width - 2; /* the word's top two bytes */
        at[0] = (uint8_t)t, at[1] = (uint8_t)(t >> 8);
    }
}

/* Group g's escape values (mask bits 8g .. 8g + 7) as 8 words, 0 where a lane does not escape;
 * moves k past them and ORs into big the values above 0xffff - ESCAPE (nonzero after the
 * saturating subtraction). */
#define UNPACK_GROUP(mask, g)                                                                  \
    __extension__({                                                                            \
        unsigned bits_ = (mask) >> (8 * (g)) & 0xff;                                           \
        __m128i b_ = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(esc_lo + k)),       \
                                        _mm_loadl_epi64((const __m128i *)(esc_hi + k)));      \
        __m128i e_ = _mm_shuffle_epi8(b_, _mm_loadu_si128((const __m128i *)esc_unpack[bits_])); \
        big = _mm_or_si128(big, _mm_subs_epu16(e_, limit));                                    \
        k += (size_t)__builtin_popcount(bits_);                                                \
        e_;                                                                                    \
    })

CKZ_TARGET_V3 static size_t restore_words2_v3(const uint8_t *sym, size_t n, const uint8_t *esc_lo,
                                              const uint8_t *esc_hi, size_t mt, size_t *m,
                                              unsigned *over, uint8_t *dst) {
    const __m256i zero = _mm256_setzero_si256(), all = _mm256_set1_epi8(-1);
    const __m128i limit = _mm_set1_epi16((short)(0xffff - ESCAPE));
    __m128i big = _mm_setzero_si128();
    size_t i = 0, k = *m;
    unsigned ov = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i s = _mm256_loadu_si256((const __m256i *)(sym + i));
        /* words 0-7 | 16-23 and 8-15 | 24-31 */
        __m256i a = _mm256_unpacklo_epi8(s, zero), b = _mm256_unpackhi_epi8(s, zero);
        __m256i w0 = _mm256_permute2x128_si256(a, b, 0x20), w1 = _mm256_permute2x128_si256(a, b, 0x31);
        uint32_t esc = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(s, all));
        if (k + 32 <= mt) { /* branch-free: whether a step escapes is hard to predict */
            __m128i e0 = UNPACK_GROUP(esc, 0), e1 = UNPACK_GROUP(esc, 1);
            __m128i e2 = UNPACK_GROUP(esc, 2), e3 = UNPACK_GROUP(esc, 3);
            w0 = _mm256_add_epi16(w0, _mm256_set_m128i(e1, e0));
            w1 = _mm256_add_epi16(w1, _mm256_set_m128i(e3, e2));
            esc = 0;
        }
        _mm256_storeu_si256((__m256i *)(dst + 2 * i), w0);
        _mm256_storeu_si256((__m256i *)(dst + 2 * i + 32), w1);
        if (esc) patch_step_escapes(esc, 2, esc_lo, esc_hi, &k, &ov, dst + 2 * i);
    }
    *m = k;
    *over |= ov | !_mm_testz_si128(big, big);
    return i;
}

CKZ_TARGET_V3 static size_t
restore_words4_v3(const uint8_t *p0, const uint8_t *p1, const uint8_t *sym,
                  size_t n, const uint8_t *esc_lo, const uint8_t *esc_hi, size_t mt,
                  size_t *m, unsigned *over, uint8_t *dst) {
    const __m256i zero = _mm256_setzero_si256(), all = _mm256_set1_epi8(-1);
    const __m128i limit = _mm_set1_epi16((short)(0xffff - ESCAPE));
    __m128i big = _mm_setzero_si128();
    size_t i = 0, k = *m;
    unsigned ov = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p0 + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(p1 + i));
        __m256i s = _mm256_loadu_si256((const __m256i *)(sym + i));
        /* 16-bit halves of words 0-7 | 16-23 (lo) and 8-15 | 24-31 (hi) */
        __m256i low_lo = _mm256_unpacklo_epi8(a, b), low_hi = _mm256_unpackhi_epi8(a, b);
        __m256i top_lo = _mm256_unpacklo_epi8(s, zero), top_hi = _mm256_unpackhi_epi8(s, zero);
        /* words 0-3 | 16-19, 4-7 | 20-23, 8-11 | 24-27, 12-15 | 28-31 */
        __m256i w0 = _mm256_unpacklo_epi16(low_lo, top_lo);
        __m256i w1 = _mm256_unpackhi_epi16(low_lo, top_lo);
        __m256i w2 = _mm256_unpacklo_epi16(low_hi, top_hi);
        __m256i w3 = _mm256_unpackhi_epi16(low_hi, top_hi);
        /* words 0-7, 8-15, 16-23, 24-31 */
        __m256i d[4] = {_mm256_permute2x128_si256(w0, w1, 0x20),
                        _mm256_permute2x128_si256(w2, w3, 0x20),
                        _mm256_permute2x128_si256(w0, w1, 0x31),
                        _mm256_permute2x128_si256(w2, w3, 0x31)};
        uint32_t esc = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(s, all));
        if (k + 32 <= mt) { /* branch-free: whether a step escapes is hard to predict */
            for (unsigned q = 0; q < 4; q++) {
                __m128i e = UNPACK_GROUP(esc, q);
                d[q] = _mm256_add_epi32(d[q], _mm256_slli_epi32(_mm256_cvtepu16_epi32(e), 16));
            }
            esc = 0;
        }
        uint8_t *out = dst + 4 * i;
        for (unsigned q = 0; q < 4; q++) _mm256_storeu_si256((__m256i *)(out + 32 * q), d[q]);
        if (esc) patch_step_escapes(esc, 4, esc_lo, esc_hi, &k, &ov, out);
    }
    *m = k;
    *over |= ov | !_mm_testz_si128(big, big);
    return i;
}
#undef UNPACK_GROUP
#endif

/* Format 4's top two planes: lo, hi (n bytes each, scratch) receive the bytes of sym[i] for a
 * symbol below ESCAPE, else of ESCAPE + the next escape value (esc_lo, esc_hi: its bytes).  sym
 * may be lo itself.  -1 when an escape value passes the 16 bits it must fit. */
static int restore_top(const uint8_t *sym, size_t n, const uint8_t *esc_lo, const uint8_t *esc_hi,
                       uint8_t *lo, uint8_t *hi) {
    size_t m = 0, start = 0;
    unsigned over = 0;
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(VBMI2)) start = restore_top_vbmi2(sym, n, esc_lo, esc_hi, &m, &over, lo, hi);
#endif
    if (sym != lo) memcpy(lo + start, sym + start, n - start);
    memset(hi + start, 0, n - start);
    for (size_t i = start; i < n; i += 16) {
        unsigned mask = i + 16 <= n ? escape_mask16(lo + i, NULL) : 0;
        if (i + 16 > n)
            for (size_t j = i; j < n; j++) mask |= (unsigned)(lo[j] == ESCAPE) << (j - i);
        for (; mask; mask &= mask - 1) {
            size_t j = i + (unsigned)__builtin_ctz(mask);
            unsigned v = ESCAPE + (esc_lo[m] | (unsigned)esc_hi[m] << 8);
            over |= v >> 16;
            lo[j] = (uint8_t)v, hi[j] = (uint8_t)(v >> 8), m++;
        }
    }
    return over ? -1 : 0;
}


/* Format 4 with 2-byte words, or 4-byte ones where AVX2 is present, unrotated: the words come
 * straight from the symbol plane and the escapes (and for 4-byte words the low planes p0, p1),
 * block by block, with the residual of `kind` inverted behind while the block is in L1 (base not
 * NULL); no planes merged.  -1 as restore_top. */
static int restore_words(const uint8_t *p0, const uint8_t *p1, const uint8_t *sym, size_t n,
                         unsigned width, const uint8_t *esc_lo, const uint8_t *esc_hi, size_t mt,
                         uint8_t *dst, const uint8_t *base, int kind) {
    size_t m = 0;
    unsigned over = 0;
#if !CKZ_DISPATCH
    (void)mt; /* the AVX2 kernels' bound */
#endif
    for (size_t i0 = 0; i0 < n; i0 += MERGE_BLOCK) {
        size_t end = n - i0 < MERGE_BLOCK ? n : i0 + MERGE_BLOCK, i = i0;
#if CKZ_DISPATCH
        if (CKZ_CPU_AT(VBMI2))
            i += width == 2 ? restore_words2_vbmi2(sym + i, end - i, esc_lo, esc_hi, &m, &over,
                                                dst + 2 * i)
                            : restore_words4_vbmi2(p0 + i, p1 + i, sym + i, end - i, esc_lo,
                                                esc_hi, &m, &over, dst + 4 * i);
        else if (CKZ_CPU_AT(V3))
            i += width == 2 ? restore_words2_v3(sym + i, end - i, esc_lo, esc_hi, mt, &m, &over,
                                                dst + 2 * i)
                            : restore_words4_v3(p0 + i, p1 + i, sym + i, end - i, esc_lo,
                                                esc_hi, mt, &m, &over, dst + 4 * i);
#endif
#if defined(__x86_64__) && defined(__SSE2__)
        for (; width == 2 && i + 16 <= end; i += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(sym + i)), z = _mm_setzero_si128();
            _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm_unpacklo_epi8(v, z));
            _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), _mm_unpackhi_epi8(v, z));
            unsigned mask = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(-1)));
            for (; mask; mask &= mask - 1) {
                size_t j = i + (unsigned)__builtin_ctz(mask);
                unsigned w = ESCAPE + (esc_lo[m] | (unsigned)esc_hi[m] << 8);
                over |= w >> 16, m++;
                dst[2 * j] = (uint8_t)w, dst[2 * j + 1] = (uint8_t)(w >> 8);
            }
        }
#endif
        for (; i < end; i++) {
            unsigned t = sym[i];
            if (t == ESCAPE) t += esc_lo[m] | (unsigned)esc_hi[m] << 8, over |= t >> 16, m++;
            if (width == 2) dst[2 * i] = (uint8_t)t, dst[2 * i + 1] = (uint8_t)(t >> 8);
            else ckz_store32(dst + 4 * i, p0[i] | (uint32_t)p1[i] << 8 | (uint32_t)t << 16);
        }
        if (base)
            ckz_residual_decode(dst + width * i0, base + width * i0, dst + width * i0, end - i0,
                                width, (unsigned)kind);
    }
    return over ? -1 : 0;
}

/* Formats 3 and 4: the planes (format 4: those under the top two, the symbol plane, then the
 * escapes' two planes), then one merge. */
static int decode_format34(const ctx_header *h, const uint8_t *end, const uint8_t *ctx, size_t n,
                           uint8_t *dst, unsigned elem_size, unsigned rotate, const uint8_t *base,
                           int kind, ckz_err *err) {
    buckets bs;
    int four = h->format == CKZ_CTX_FORMAT;
    const uint8_t *p = h->body;
    if (four) {
        /* the buckets as stored: any increasing starts give indices below B */
        if (elem_size < 2)
            return ckz_fail(err, "format 4 needs elements of 2 bytes or more, not %u", elem_size);
        bs.count = (unsigned)h->buckets;
        if ((bs.count == 0) != (n == 0))
            return ckz_fail(err, "format 4 stream has %u buckets for %zu elements", bs.count, n);
        if (bs.count > 1 && (size_t)(end - p) < bs.count - 1)
            return ckz_fail(err, "stream truncated in the bucket starts");
        bs.first[0] = 0;
        for (unsigned b = 1; b < bs.count; b++) {
            bs.first[b] = *p++;
            if (bs.first[b] <= bs.first[b - 1]) /* bucket 0 starts at or below bucket 1 */
                return ckz_fail(err, "bucket %u starts at context %u, not above bucket %u's %u",
                                b, bs.first[b], b - 1, bs.first[b - 1]);
        }
    } else {
        find_buckets(ctx, n, &bs);
        if (h->buckets != bs.count) return bucket_mismatch(h->buckets, bs.count, err);
    }
    unsigned B = bs.count;
    /* two planes' B decode tables | B freq tables | planes | format 4: the escapes' two planes |
     * bucket indices.  <= 2 dst_len + n + 1 MiB. */
    size_t span = (size_t)B * SCALE + TABLE_SLACK;
    size_t bytes = n * elem_size, tables = 2 * span * sizeof(uint32_t);
    size_t total = tables + (size_t)B * 256 * sizeof(uint16_t) + bytes + (four ? 2 * n : 0) + n;
    uint8_t *mem = ckz_scratch_get(CKZ_SCRATCH_DECODE, total); /* this thread's, kept */
    if (!mem) return ckz_fail(err, "out of memory for %zu bytes of decoder scratch", total);
    plane_reader r = {ctx, &bs, NULL, 0, (uint32_t *)mem, span,
                      (uint16_t (*)[256])(mem + tables)};
    uint8_t *planes = mem + tables + (size_t)B * 256 * sizeof(uint16_t);
    uint8_t *esc = planes + bytes;
    r.bk = esc + (four ? 2 * n : 0);
    const uint8_t *plane_at[8];
    int rc = -1;
    unsigned coded = four ? elem_size - 1 : elem_size; /* format 4: the symbol plane last */
    if (read_planes(&r, &p, end, n, coded, 0, four ? HALVES_OK : BUCKETED_OK, planes, plane_at,
                    err))
        goto done;
    if (four) {
        const uint8_t *sym = plane_at[elem_size - 2], *esc_at[2];
        size_t m = count_escapes(sym, NULL, n);
        if (read_planes(&r, &p, end, m, 2, elem_size, 0, esc, esc_at, err)) goto done;
        if (p != end) {
            ckz_fail(err, "stream has %zu trailing bytes", (size_t)(end - p));
            goto done;
        }
        uint8_t *lo = planes + (elem_size - 2) * n, *hi = lo + n;
        int fused = rotate == 0 && (elem_size == 2 || (elem_size == 4 && CKZ_CPU_AT(V3)));
        if (fused ? restore_words(plane_at[0], plane_at[1], sym, n, elem_size, esc_at[0],
                                  esc_at[1], m, dst, base, kind)
                  : restore_top(sym, n, esc_at[0], esc_at[1], lo, hi)) {
            ckz_fail(err, "format 4: an escape value exceeds %u", 0xffff - ESCAPE);
            goto done;
        }
        if (fused) {
            rc = 0;
            goto done;
        }
        plane_at[elem_size - 2] = lo;
        plane_at[elem_size - 1] = hi;
    }
    if (p != end) {
        ckz_fail(err, "stream has %zu trailing bytes", (size_t)(end - p));
        goto done;
    }
    merge_residual(plane_at, dst, n, elem_size, rotate, base, kind);
    rc = 0;
done:
    ckz_scratch_put(CKZ_SCRATCH_DECODE, mem);
    return rc;
}

int ckz_decode_planes_ctx(const uint8_t *src, size_t len, const uint8_t *ctx, size_t ctx_len,
                          uint8_t *dst, size_t dst_len, unsigned elem_size, unsigned rotate,
                          ckz_err *err) {
    return ckz_decode_planes_ctx_residual(src, len, ctx, ctx_len, dst, dst_len, elem_size,
                                          rotate, NULL, 0, err);
}

int ckz_decode_planes_ctx_residual(const uint8_t *src, size_t len, const uint8_t *ctx,
                                   size_t ctx_len, uint8_t *dst, size_t dst_len,
                                   unsigned elem_size, unsigned rotate, const uint8_t *base,
                                   int kind, ckz_err *err) {
    ctx_header h;
    if (parse_ctx_header(src, len, &h, err)) return -1;
    if (h.elem_size != elem_size)
        return ckz_fail(err, "stream has elem_size %u but %u was given", h.elem_size, elem_size);
    if (h.n != ctx_len)
        return ckz_fail(err, "context holds %zu bytes but the stream has %llu elements", ctx_len,
                        (unsigned long long)h.n);
    size_t n = ctx_len, bytes = n * elem_size; /* <= CKZ_MAX_DECODED: checked above */
    if (bytes != dst_len)
        return ckz_fail(err, "destination holds %zu bytes but the stream decodes to %zu",
                        dst_len, bytes);
    if (base && (kind < 0 || kind >= CKZ_RESIDUAL_KINDS))
        return ckz_fail(err, "residual kind %d is outside 0..%d", kind, CKZ_RESIDUAL_KINDS - 1);
    if (h.format == CKZ_CTX_FORMAT2) {
        if (decode_format2(&h, src + len, ctx, n, dst, elem_size, rotate, err)) return -1;
        if (base) ckz_residual_decode(dst, base, dst, n, elem_size, (unsigned)kind);
        return 0;
    }
    return decode_format34(&h, src + len, ctx, n, dst, elem_size, rotate, base, kind, err);
}
