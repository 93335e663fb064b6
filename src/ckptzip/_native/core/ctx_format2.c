/* ctx_format2.c - format 2 of the context stream, decoded only (ctx.h, docs/STREAMS.md): each
 * plane stored as one format-1 segment per bucket (stream.h), the plane's bytes permuted into
 * bucket order: by context value, then by lane, then by index, where lane l is the l-th of
 * CKZ_CTX_LANES near-equal runs of elements.  The decoder decodes the segments into a
 * bucket-ordered scratch and gathers each element from it in one pass.  ctx_decode.c dispatches
 * here; retiring format 2 is deleting this file and that call.
 */
#include "ctx_internal.h"

#include <stdlib.h>

#include "hist.h"
#include "stream.h"

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
    L->buckets = ckz_ctx_plan_buckets(total, n, L->size, first);
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

/* Format 2: segments into a bucket-ordered scratch, then one gather pass. */
int ckz_ctx_decode_format2(const ctx_header *h, const uint8_t *end, const uint8_t *ctx, size_t n,
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
        ckz_ctx_bucket_mismatch(h->buckets, L->buckets, err);
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
