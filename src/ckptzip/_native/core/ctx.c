/* ctx.c - the context coder's shared model (see ctx.h for the model, docs/STREAMS.md for the
 * layouts): the context bytes, the buckets and every element's bucket index, the bucket tables'
 * fixed kinds, format 4's escape count and shuffle tables.  The encoder is ctx_encode.c, the
 * decoder of formats 3 and 4 ctx_decode.c, format 2's decoder ctx_format2.c.
 *
 * Format 3 (written): the context histogram gives the buckets and each element's bucket index;
 * the planes are split in element order, and each coded plane is one RANS32 stream whose symbol
 * i takes the table of bucket(ctx[i]) (ckz_rans32_encode_tab): no permutation, one stream per
 * plane.  Per plane the encoder picks RAW, CONST, one table, or a table per bucket (each bucket's
 * table uniform, single-valued or coded) by computed sizes.
 * Format 2 (decoded only): the planes permuted into bucket order, one segment per (plane,
 * bucket); the decoder decodes the segments into a bucket-ordered scratch and gathers.
 */
#include "ctx_internal.h"

#include "hist.h"

_Static_assert(CKZ_CTX_MAX_BUCKETS * CKZ_CTX_MIN_BUCKET > 0, "bucket bounds");

/* ---- context bytes --------------------------------------------------------------------------- */

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

/* ---- buckets --------------------------------------------------------------------------------- */

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
unsigned ckz_ctx_plan_buckets(const uint32_t h[256], size_t n, size_t size[CKZ_CTX_MAX_BUCKETS],
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

/* ---- bucket indices -------------------------------------------------------------------------- */

#if CKZ_DISPATCH

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

void ckz_ctx_find_buckets(const uint8_t *ctx, size_t n, buckets *bs) {
    uint32_t h[256]; /* exponent bytes: ckz_hist_count counts them by window compares */
    ckz_hist_total(ctx, n, h);
    bs->count = ckz_ctx_plan_buckets(h, n, bs->size, bs->first);
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

void ckz_ctx_bucket_index(const uint8_t *ctx, size_t n, const uint8_t *first, unsigned B,
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

/* ---- bucket tables (docs/STREAMS.md, format 3; ctx_internal.h) ------------------------------- */

void ckz_ctx_fill_uniform(uint16_t freq[256]) {
    for (unsigned v = 0; v < 256; v++) freq[v] = SCALE / 256;
}

void ckz_ctx_fill_single(uint16_t freq[256], unsigned v, unsigned shift) {
    memset(freq, 0, 256 * sizeof freq[0]);
    freq[v] = (uint16_t)(SCALE - (1u << shift));
    freq[v ^ 1] = (uint16_t)(1u << shift);
}

/* ---- format 4's escapes ---------------------------------------------------------------------- */

/* Elements of n whose top two bytes (encoder) or symbol (decoder: hi NULL) escape: byte counters
 * summed every 255 blocks (no popcount instruction in the baseline). */
size_t ckz_ctx_count_escapes(const uint8_t *lo, const uint8_t *hi, size_t n) {
    size_t m = 0, i = 0;
#if defined(__x86_64__) && defined(__SSE2__)
    while (i + 16 <= n) {
        __m128i acc = _mm_setzero_si128();
        for (unsigned k = 0; k < 255 && i + 16 <= n; k++, i += 16)
            acc = _mm_sub_epi8(acc, escape_bytes16(lo + i, hi ? hi + i : NULL));
        __m128i sums = _mm_sad_epu8(acc, _mm_setzero_si128());
        m += (size_t)_mm_cvtsi128_si64(sums) +
             (size_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(sums, sums));
    }
#endif
    for (; i < n; i++) m += lo[i] == ESCAPE || (hi && hi[i]);
    return m;
}

#if CKZ_DISPATCH
/* ctx_internal.h describes them. */
uint8_t ckz_ctx_esc_pack[256][16], ckz_ctx_esc_unpack[256][16];
#endif

/* Fills format 4's shuffle tables. */
void ckz_ctx_init(void) {
#if CKZ_DISPATCH
    for (unsigned mask = 0; mask < 256; mask++) {
        memset(ckz_ctx_esc_pack[mask], 0x80, 16);
        memset(ckz_ctx_esc_unpack[mask], 0x80, 16);
        for (unsigned j = 0, r = 0; j < 8; j++)
            if (mask >> j & 1) {
                ckz_ctx_esc_pack[mask][r] = (uint8_t)(2 * j);
                ckz_ctx_esc_pack[mask][8 + r] = (uint8_t)(2 * j + 1);
                ckz_ctx_esc_unpack[mask][2 * j] = (uint8_t)r;
                ckz_ctx_esc_unpack[mask][2 * j + 1] = (uint8_t)(8 + r);
                r++;
            }
    }
#endif
}

/* ---- decoding -------------------------------------------------------------------------------- */

int ckz_ctx_bucket_mismatch(uint64_t stored, unsigned computed, ckz_err *err) {
    return ckz_fail(err, "stream has %llu buckets but the context gives %u (not the encoder's "
                    "context?)", (unsigned long long)stored, computed);
}
