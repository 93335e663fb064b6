/* rans.c - static rANS with 32-bit states and 16-bit renormalization (after Fabian Giesen's
 * rans_byte.h and rans64.h).  See rans.h for the contracts.
 *
 * Invariants: a state x lies in [L, 2^32) between symbols, L = 2^16.  Coding symbol s (frequency
 * f, cumulative start c) maps x to (x / f) * SCALE + x % f + c; the encoder first shifts out one
 * 16-bit word if x >= x_max = (L >> PROB_BITS << 16) * f, which keeps the result below 2^32, and
 * one word always suffices (x < 2^32 gives x >> 16 < 2^16 <= x_max).  The decoder inverts:
 * slot = x % SCALE, x = f * (x / SCALE) + slot - c, then shifts one word in if x < L; one is
 * enough since the step leaves x >= f * (L >> PROB_BITS) >= 2^4, and 2^4 << 16 >= L.
 */
#include "rans.h"

#define PROB_BITS CKZ_RANS_PROB_BITS
#define SCALE CKZ_RANS_PROB_SCALE
#define L CKZ_RANS_L

void ckz_rans_normalize(const uint64_t total[256], uint64_t n, uint16_t freq[256]) {
    uint32_t sum = 0;
    unsigned top = 0;
    for (unsigned s = 0; s < 256; s++) {
        uint64_t f = total[s] ? total[s] * SCALE / n : 0; /* n <= 2^56: no overflow */
        if (total[s] && !f) f = 1;
        freq[s] = (uint16_t)f;
        sum += (uint32_t)f;
        if (total[s] > total[top]) top = s;
    }
    /* Rounding moved the sum off SCALE: the difference goes to or comes from the largest
     * frequencies, never taking one below 1 (>= 2 used symbols, each >= 1, so this ends). */
    while (sum > SCALE) {
        unsigned big = 0;
        for (unsigned s = 1; s < 256; s++)
            if (freq[s] > freq[big]) big = s;
        uint32_t cut = sum - SCALE < freq[big] - 1u ? sum - SCALE : freq[big] - 1u;
        freq[big] = (uint16_t)(freq[big] - cut);
        sum -= cut;
    }
    freq[top] = (uint16_t)(freq[top] + (SCALE - sum));
}

/* ---- table ---------------------------------------------------------------------------------- */

static void used_range(const uint16_t freq[256], unsigned *first, unsigned *count) {
    unsigned lo = 0, hi = 255;
    while (lo < 255 && !freq[lo]) lo++;
    while (hi > lo && !freq[hi]) hi--;
    *first = lo;
    *count = hi - lo + 1;
}

size_t ckz_rans_table_size(const uint16_t freq[256]) {
    unsigned first, count;
    used_range(freq, &first, &count);
    size_t size = 2;
    for (unsigned j = 0; j < count; j++) size += freq[first + j] < 0x80 ? 1 : 2;
    return size;
}

size_t ckz_rans_write_table(const uint16_t freq[256], uint8_t *out) {
    unsigned first, count;
    used_range(freq, &first, &count);
    uint8_t *o = out;
    *o++ = (uint8_t)first;
    *o++ = (uint8_t)(count - 1);
    for (unsigned j = 0; j < count; j++) {
        unsigned f = freq[first + j]; /* < SCALE = 2^12: at most two LEB128 bytes */
        if (f >= 0x80) *o++ = (uint8_t)(f | 0x80), f >>= 7;
        *o++ = (uint8_t)f;
    }
    return (size_t)(o - out);
}

int ckz_rans_read_table(const uint8_t *in, size_t avail, uint16_t freq[256], size_t *used_bytes,
                        ckz_err *err) {
    if (avail < 2) return ckz_fail(err, "rans table: %zu bytes left, need 2", avail);
    unsigned first = in[0], count = (unsigned)in[1] + 1;
    if (first + count > 256)
        return ckz_fail(err, "rans table: symbols %u..%u exceed 255", first,
                                first + count - 1);
    memset(freq, 0, 256 * sizeof freq[0]);
    size_t pos = 2;
    uint32_t sum = 0; /* <= 256 * (2^14 - 1): no overflow */
    unsigned used = 0;
    for (unsigned j = 0; j < count; j++) {
        if (pos >= avail) return ckz_fail(err, "rans table truncated");
        unsigned f = in[pos++];
        if (f & 0x80) {
            if (pos >= avail) return ckz_fail(err, "rans table truncated");
            if (!in[pos]) return ckz_fail(err, "rans table: non-minimal frequency");
            f = (f & 0x7f) | ((unsigned)in[pos++] << 7);
        }
        if (f >= SCALE)
            return ckz_fail(err, "rans table: symbol %u has frequency %u >= %u",
                                    first + j, f, SCALE);
        freq[first + j] = (uint16_t)f;
        sum += f;
        used += f > 0;
    }
    if (!freq[first] || !freq[first + count - 1])
        return ckz_fail(err, "rans table: not in canonical form");
    if (used < 2 || sum != SCALE)
        return ckz_fail(err, "rans table: %u symbols with frequency sum %u, need >= 2 "
                                "summing to %u", used, sum, SCALE);
    *used_bytes = pos;
    return 0;
}

/* ---- encoder -------------------------------------------------------------------------------- */

/* Per-symbol encoder constants: x / f is a multiply by a 64-bit fixed-point reciprocal, exact for
 * every x < 2^32 (rans64.h's Alverson construction, with 32 bits to spare). */
typedef struct {
    uint64_t rcp_freq;  /* ceil(2^(shift + 63) / f), shift = ceil(log2 f) */
    uint32_t x_max;     /* flush a word when x >= x_max */
    uint32_t bias;      /* c, or c + SCALE - 1 when f == 1 */
    uint32_t cmpl_freq; /* SCALE - f */
    uint32_t rcp_shift;
} enc_sym;

static void enc_sym_init(enc_sym *e, uint32_t start, uint32_t f) {
    e->x_max = ((L >> PROB_BITS) << 16) * f; /* <= 2^4 * 2^16 * (2^12 - 1) < 2^32 */
    e->cmpl_freq = SCALE - f;
    if (f < 2) {
        /* f == 1: x / 1 = x; rcp = 2^64 - 1 with shift 0 yields x - 1, which bias compensates. */
        e->rcp_freq = ~0ull;
        e->rcp_shift = 0;
        e->bias = start + SCALE - 1;
    } else {
        uint32_t shift = 0;
        while (f > (1u << shift)) shift++;
        e->rcp_freq = (uint64_t)((((unsigned __int128)1 << (shift + 63)) + f - 1) / f);
        e->rcp_shift = shift - 1;
        e->bias = start;
    }
}

/* Encoder step: flush one 16-bit word if x >= x_max, then map x.  A branch, not a select, for
 * the reason given at RANS_STEP: it keeps the flush off the state's dependency chain. */
#define RANS_ENC_PUT(x, p, e)                                                                  \
    do {                                                                                       \
        if ((x) >= (e)->x_max) {                                                               \
            (p) -= 2;                                                                          \
            (p)[0] = (uint8_t)(x);                                                             \
            (p)[1] = (uint8_t)((x) >> 8);                                                      \
            (x) >>= 16;                                                                        \
        }                                                                                      \
        uint32_t q_ = (uint32_t)(((unsigned __int128)(x) * (e)->rcp_freq) >> 64 >>            \
                                 (e)->rcp_shift);                                              \
        (x) = (x) + (e)->bias + q_ * (e)->cmpl_freq; /* (x / f) * SCALE + x % f + start */    \
    } while (0)

/* Bytes reserved per stream: a symbol of frequency >= 1 emits at most PROB_BITS bits on average
 * (2 bytes reserved, the most one step can flush), plus the 4 state bytes. */
static size_t region_size(size_t n) {
    return 2 * ((n + CKZ_HUF_STREAMS - 1) / CKZ_HUF_STREAMS) + 4;
}

size_t ckz_rans_scratch_size(size_t n) { return CKZ_HUF_STREAMS * region_size(n); }

void ckz_rans_encode(const uint8_t *src, size_t n, const uint16_t freq[256], uint8_t *scratch,
                     const uint8_t *start[CKZ_HUF_STREAMS], size_t size[CKZ_HUF_STREAMS]) {
    enc_sym es[256];
    uint32_t cum = 0;
    for (unsigned s = 0; s < 256; s++) {
        enc_sym_init(&es[s], cum, freq[s] ? freq[s] : 1);
        cum += freq[s];
    }
    size_t region = region_size(n);
    /* rANS is last-in first-out: each quarter is coded backwards, its bytes written backwards
     * from the end of its region, so the decoder reads forwards.  The four quarters run in
     * lockstep (independent chains) over the positions all of them have. */
    const uint8_t *s0 = src, *s1 = src + ckz_huf_stream_start(n, 1);
    const uint8_t *s2 = src + ckz_huf_stream_start(n, 2), *s3 = src + ckz_huf_stream_start(n, 3);
    uint8_t *p0 = scratch + region, *p1 = p0 + region, *p2 = p1 + region, *p3 = p2 + region;
    uint32_t x0 = L, x1 = L, x2 = L, x3 = L;
    size_t common = ckz_huf_stream_count(n, 3);
    for (size_t i = ckz_huf_stream_count(n, 0); i-- > common;) {
        RANS_ENC_PUT(x0, p0, &es[s0[i]]);
        if (i < ckz_huf_stream_count(n, 1)) RANS_ENC_PUT(x1, p1, &es[s1[i]]);
        if (i < ckz_huf_stream_count(n, 2)) RANS_ENC_PUT(x2, p2, &es[s2[i]]);
    }
    for (size_t i = common; i-- > 0;) {
        RANS_ENC_PUT(x0, p0, &es[s0[i]]);
        RANS_ENC_PUT(x1, p1, &es[s1[i]]);
        RANS_ENC_PUT(x2, p2, &es[s2[i]]);
        RANS_ENC_PUT(x3, p3, &es[s3[i]]);
    }
    uint32_t xs[CKZ_HUF_STREAMS] = {x0, x1, x2, x3};
    uint8_t *ps[CKZ_HUF_STREAMS] = {p0, p1, p2, p3};
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) {
        uint8_t *p = ps[k] - 4;
        ckz_store32(p, xs[k]);
        start[k] = p;
        size[k] = (size_t)(scratch + (k + 1) * region - p);
    }
}

/* ---- decoder -------------------------------------------------------------------------------- */

/* One decode step: emit the symbol of x's slot, advance the state, refill one 16-bit word if
 * x < L.  The refill is a branch on purpose: a select would put the word load on the state's
 * dependency chain (measured 2x slower); a low-entropy stream refills rarely (H/16 per symbol),
 * so the branch predicts well.  The table entry holds the symbol, slot - c and f (on top, so
 * that one shift feeds the multiply), making the step one multiply-add. */
#define RANS_STEP(T, x, p, pos, out)                                                           \
    do {                                                                                       \
        uint32_t e_ = (T)[(x) & (SCALE - 1)];                                                  \
        *(out) = (uint8_t)e_;                                                                  \
        (x) = (e_ >> 20) * ((x) >> PROB_BITS) + ((e_ >> 8) & 0xfff);                           \
        if ((x) < L) {                                                                         \
            (x) = ((x) << 16) | ckz_load16((p) + (pos));                                       \
            (pos) += 2;                                                                        \
        }                                                                                      \
    } while (0)
#define RANS_MAX_REFILL 2 /* bytes one step may read */

/* The bulk of the decode: four state chains in lockstep while every stream has RANS_MAX_REFILL
 * bytes in hand (scalars, since the byte stores may alias arrays).  Returns each stream's state
 * and position, and through *done how many symbols of each it decoded. */
CKZ_INLINE void lockstep_impl(const uint32_t *T, const uint8_t *const in[CKZ_HUF_STREAMS],
                              const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n,
                              uint32_t xs[CKZ_HUF_STREAMS], size_t pos[CKZ_HUF_STREAMS],
                              size_t *done) {
    const uint8_t *p0 = in[0], *p1 = in[1], *p2 = in[2], *p3 = in[3];
    uint32_t x0 = ckz_load32(p0), x1 = ckz_load32(p1), x2 = ckz_load32(p2), x3 = ckz_load32(p3);
    size_t s0 = 4, s1 = 4, s2 = 4, s3 = 4, i = 0, common = ckz_huf_stream_count(n, 3);
    uint8_t *o0 = out, *o1 = out + ckz_huf_stream_start(n, 1);
    uint8_t *o2 = out + ckz_huf_stream_start(n, 2), *o3 = out + ckz_huf_stream_start(n, 3);
    for (;;) {
        /* Steps every stream can take with bytes in hand: each reads at most RANS_MAX_REFILL. */
        size_t safe = common - i, room;
        room = (size[0] - s0) / RANS_MAX_REFILL, safe = room < safe ? room : safe;
        room = (size[1] - s1) / RANS_MAX_REFILL, safe = room < safe ? room : safe;
        room = (size[2] - s2) / RANS_MAX_REFILL, safe = room < safe ? room : safe;
        room = (size[3] - s3) / RANS_MAX_REFILL, safe = room < safe ? room : safe;
        if (!safe) break;
        for (size_t end = i + safe; i < end; i++) {
            RANS_STEP(T, x0, p0, s0, o0 + i);
            RANS_STEP(T, x1, p1, s1, o1 + i);
            RANS_STEP(T, x2, p2, s2, o2 + i);
            RANS_STEP(T, x3, p3, s3, o3 + i);
        }
    }
    xs[0] = x0, xs[1] = x1, xs[2] = x2, xs[3] = x3;
    pos[0] = s0, pos[1] = s1, pos[2] = s2, pos[3] = s3;
    *done = i;
}
CKZ_VERSIONED(lockstep, (const uint32_t *T, const uint8_t *const in[CKZ_HUF_STREAMS],
                         const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n,
                         uint32_t xs[CKZ_HUF_STREAMS], size_t pos[CKZ_HUF_STREAMS],
                         size_t *done),
              (T, in, size, out, n, xs, pos, done))

int ckz_rans_decode(const uint16_t freq[256], const uint8_t *const in[CKZ_HUF_STREAMS],
                    const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n, ckz_err *err) {
    uint32_t T[SCALE]; /* slot -> symbol | (slot - c) << 8 | f << 20; f, slot - c < 2^12 */
    uint32_t cum = 0;  /* every slot is written once: the table reader checked the sum */
    for (unsigned s = 0; s < 256; s++) {
        for (uint32_t j = 0; j < freq[s]; j++)
            T[cum + j] = s | (j << 8) | ((uint32_t)freq[s] << 20);
        cum += freq[s];
    }
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++)
        if (size[k] < 4)
            return ckz_fail(err, "rans stream %u has %zu bytes, fewer than its 4-byte state", k,
                            size[k]);
    uint32_t xs[CKZ_HUF_STREAMS];
    size_t pos[CKZ_HUF_STREAMS], i;
    lockstep(T, in, size, out, n, xs, pos, &i);
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) {
        /* The rest of each stream, one bounds-checked byte at a time. */
        size_t count = ckz_huf_stream_count(n, k), ps = pos[k];
        uint32_t x = xs[k];
        const uint8_t *p = in[k];
        uint8_t *o = out + ckz_huf_stream_start(n, k);
        for (size_t j = i; j < count; j++) {
            uint32_t e = T[x & (SCALE - 1)];
            o[j] = (uint8_t)e;
            x = (e >> 20) * (x >> PROB_BITS) + ((e >> 8) & 0xfff);
            if (x < L) {
                if (size[k] - ps < RANS_MAX_REFILL)
                    return ckz_fail(err, "rans stream %u ends after %zu of %zu symbols", k, j,
                                    count);
                x = (x << 16) | ckz_load16(p + ps);
                ps += RANS_MAX_REFILL;
            }
        }
        if (x != L || ps != size[k])
            return ckz_fail(err, "rans stream %u: final state 0x%08x (expected 0x%08x), %zu of "
                            "%zu bytes used", k, x, L, ps, size[k]);
    }
    return 0;
}
