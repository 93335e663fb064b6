/* ctx.c - byte planes coded in context buckets (see ctx.h for the model, docs/STREAMS.md for the
 * layout).
 *
 * Encode: context histogram per lane -> buckets -> one pass that splits the elements into planes
 * and permutes them into bucket order at once -> one segment per (plane, bucket).
 * Decode: the same histogram and buckets from the caller's context -> the segments into a
 * bucket-ordered scratch -> one pass that gathers each element's bytes and merges them.
 */
#include "ctx.h"

#include <stdlib.h>

_Static_assert(CKZ_CTX_MAX_BUCKETS * CKZ_CTX_MIN_BUCKET > 0, "bucket bounds");

/* The permutation: cur[l][v] is where the next element of lane l with context v goes in the
 * bucket-ordered planes; size[b] is bucket b's element count, B the bucket count. */
typedef struct {
    size_t cur[CKZ_CTX_LANES][256];
    size_t size[CKZ_CTX_MAX_BUCKETS];
    unsigned buckets;
} layout;

CKZ_INLINE uint64_t load_elem(const uint8_t *p, unsigned k) {
    switch (k) {
    case 1: return p[0];
    case 2: return ckz_load16(p);
    case 4: return ckz_load32(p);
    default: return ckz_load64(p);
    }
}

CKZ_INLINE void store_elem(uint8_t *p, uint64_t w, unsigned k) {
    switch (k) {
    case 1: p[0] = (uint8_t)w; break;
    case 2: p[0] = (uint8_t)w, p[1] = (uint8_t)(w >> 8); break;
    case 4: ckz_store32(p, (uint32_t)w); break;
    default: ckz_store64(p, w); break;
    }
}

/* Rotations of a (8k)-bit word held in a uint64; 8k is a power of two, so `& (bits - 1)` keeps
 * rotate == 0 from shifting by the full width. */
CKZ_INLINE uint64_t rotl_k(uint64_t w, unsigned r, unsigned k) {
    unsigned bits = 8 * k;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    return ((w << r) | (w >> ((bits - r) & (bits - 1)))) & mask;
}

CKZ_INLINE uint64_t rotr_k(uint64_t w, unsigned r, unsigned k) {
    unsigned bits = 8 * k;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    return ((w >> r) | (w << ((bits - r) & (bits - 1)))) & mask;
}

/* ---- context bytes -------------------------------------------------------------------------- */

CKZ_INLINE void context_k_impl(const uint8_t *restrict src, size_t n, unsigned k, unsigned r,
                               uint8_t *restrict ctx) {
    for (size_t i = 0; i < n; i++)
        ctx[i] = (uint8_t)(rotl_k(load_elem(src + i * k, k), r, k) >> (8 * (k - 1)));
}
#define CONTEXT_K(K)                                                                           \
    CKZ_INLINE void context##K##_impl(const uint8_t *restrict src, size_t n, unsigned r,         \
                                      uint8_t *restrict ctx) {                                 \
        context_k_impl(src, n, K, r, ctx);                                                     \
    }                                                                                          \
    CKZ_VERSIONED(context##K, (const uint8_t *restrict src, size_t n, unsigned r,              \
                               uint8_t *restrict ctx), (src, n, r, ctx))
CONTEXT_K(1)
CONTEXT_K(2)
CONTEXT_K(4)
CONTEXT_K(8)

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

/* Buckets: walk the context values upwards, closing a bucket as soon as it holds min_bucket(n)
 * elements; a last, smaller run joins the bucket before it (or is the only bucket).  Every
 * closed bucket holds >= n / CKZ_CTX_MAX_BUCKETS elements, so there are at most that many, and
 * every bucket is non-empty (B = 0 only for n = 0). */
static void plan_layout(const uint8_t *ctx, size_t n, layout *L) {
    /* Lanes are the Huffman streams' runs (CKZ_CTX_LANES == CKZ_HUF_STREAMS), so the coder's
     * per-stream histogram is the per-lane histogram of the contexts. */
    uint32_t h[CKZ_CTX_LANES][256];
    ckz_huf_count(ctx, n, h);

    size_t least = min_bucket(n), acc = 0, pos = 0;
    unsigned b = 0;
    memset(L->size, 0, sizeof L->size);
    for (unsigned v = 0; v < 256; v++) {
        for (unsigned l = 0; l < CKZ_CTX_LANES; l++) {
            size_t cnt = h[l][v];
            L->cur[l][v] = pos;
            pos += cnt;
            acc += cnt;
        }
        /* b < CKZ_CTX_MAX_BUCKETS when acc > 0: b closed buckets hold b * least <= n - acc
         * elements, and least >= n / CKZ_CTX_MAX_BUCKETS. */
        if (acc) {
            L->size[b] += acc;
            if (L->size[b] >= least) b++;
            acc = 0;
        }
    }
    if (b < CKZ_CTX_MAX_BUCKETS && L->size[b]) {
        if (b) L->size[b - 1] += L->size[b], L->size[b] = 0; /* short tail joins its neighbour */
        else b = 1;                                          /* the only bucket */
    }
    L->buckets = b;
}

/* Element i of lane l goes to cur[l][ctx[i]]++ in every plane.  The lanes run in lockstep so
 * that the four cursor increments (a store-to-load chain when contexts repeat) overlap. */
#define FOR_EACH_ELEMENT(BODY)                                                                 \
    do {                                                                                       \
        size_t start_[CKZ_CTX_LANES], count_[CKZ_CTX_LANES];                                   \
        for (unsigned l_ = 0; l_ < CKZ_CTX_LANES; l_++) {                                      \
            start_[l_] = ckz_huf_stream_start(n, l_);                                          \
            count_[l_] = ckz_huf_stream_count(n, l_);                                          \
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

CKZ_INLINE void scatter_k_impl(const uint8_t *restrict src, const uint8_t *restrict ctx,
                               size_t n, unsigned k, unsigned r, layout *L,
                               uint8_t *restrict planes) {
    FOR_EACH_ELEMENT({
        size_t j = L->cur[l][ctx[i]]++;
        uint64_t w = rotl_k(load_elem(src + i * k, k), r, k);
        for (unsigned p = 0; p < k; p++) planes[p * n + j] = (uint8_t)(w >> (8 * p));
    });
}

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
    CKZ_INLINE void scatter##K##_impl(const uint8_t *restrict src, const uint8_t *restrict ctx, \
                                      size_t n, unsigned r, layout *L,                         \
                                      uint8_t *restrict planes) {                              \
        scatter_k_impl(src, ctx, n, K, r, L, planes);                                          \
    }                                                                                          \
    CKZ_VERSIONED(scatter##K, (const uint8_t *restrict src, const uint8_t *restrict ctx,       \
                               size_t n, unsigned r, layout *L, uint8_t *restrict planes),     \
                  (src, ctx, n, r, L, planes))                                                 \
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

/* ---- encoder -------------------------------------------------------------------------------- */

size_t ckz_encode_ctx_bound(size_t n, unsigned elem_size) {
    return CKZ_CTX_HEADER + (size_t)elem_size * CKZ_CTX_MAX_BUCKETS * CKZ_SEGMENT_OVERHEAD +
           n * elem_size;
}

int ckz_encode_planes_ctx(const uint8_t *src, const uint8_t *ctx, size_t n, unsigned elem_size,
                          unsigned rotate, uint8_t *out, size_t *out_len, ckz_err *err) {
    size_t bytes = n * elem_size;
    uint8_t *planes = malloc(bytes ? bytes : 1);
    layout *L = malloc(sizeof *L);
    if (!planes || !L) {
        free(planes);
        free(L);
        return ckz_fail(err, "out of memory for %zu bytes of planes", bytes);
    }
    plan_layout(ctx, n, L);
    unsigned B = L->buckets;
    switch (elem_size) {
    case 1: scatter1(src, ctx, n, rotate, L, planes); break;
    case 2: scatter2(src, ctx, n, rotate, L, planes); break;
    case 4: scatter4(src, ctx, n, rotate, L, planes); break;
    default: scatter8(src, ctx, n, rotate, L, planes); break;
    }
    uint8_t *o = out;
    *o++ = CKZ_CTX_FORMAT;
    o += ckz_put_varint(o, n);
    *o++ = (uint8_t)elem_size;
    o += ckz_put_varint(o, B);
    for (unsigned p = 0; p < elem_size; p++) {
        const uint8_t *s = planes + p * n;
        for (unsigned b = 0; b < B; b++) {
            o += ckz_put_segment(s, L->size[b], o);
            s += L->size[b];
        }
    }
    *out_len = (size_t)(o - out);
    free(L);
    free(planes);
    return 0;
}

/* ---- decoder -------------------------------------------------------------------------------- */

typedef struct {
    uint64_t n;          /* elements */
    unsigned elem_size;
    uint64_t buckets;
    const uint8_t *body; /* first segment */
} ctx_header;

static int parse_ctx_header(const uint8_t *src, size_t len, ctx_header *h, ckz_err *err) {
    const uint8_t *p = src, *end = src + len;
    if (!len) return ckz_fail(err, "stream is empty");
    if (*p != CKZ_CTX_FORMAT)
        return ckz_fail(err, "stream format byte is 0x%02x, expected 0x%02x (context planes)",
                        *p, CKZ_CTX_FORMAT);
    p++;
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

int ckz_decode_planes_ctx(const uint8_t *src, size_t len, const uint8_t *ctx, size_t ctx_len,
                          uint8_t *dst, size_t dst_len, unsigned elem_size, unsigned rotate,
                          ckz_err *err) {
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
    layout *L = malloc(sizeof *L);
    uint8_t *planes = malloc(bytes ? bytes : 1); /* == dst_len: bounded by the caller's buffer */
    int rc = -1;
    if (!planes || !L) {
        ckz_fail(err, "out of memory for %zu bytes of planes", bytes);
        goto done;
    }
    plan_layout(ctx, n, L);
    if (h.buckets != L->buckets) {
        ckz_fail(err, "stream has %llu buckets but the context gives %u (not the encoder's "
                 "context?)", (unsigned long long)h.buckets, L->buckets);
        goto done;
    }
    const uint8_t *p = h.body, *end = src + len;
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
