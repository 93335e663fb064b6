/* ctx_decode.c - the context coder's decoder of formats 3 and 4 (ctx.h: ckz_decode_planes_ctx),
 * and the dispatch to format 2's (ctx_format2.c): the header, the bucket tables, the planes
 * decoded (two bucketed planes or a HALVES plane's halves in one rANS loop), format 4's top two
 * bytes restored from the symbols and escapes (by hand with AVX2 and AVX-512 VBMI2), the planes
 * merged with the residual inverted behind.
 */
#include "ctx_internal.h"

#include <stdlib.h>

#include "memory.h"
#include "planes.h"
#include "residual.h"

/* ---- bucket tables (docs/STREAMS.md, format 3) ----------------------------------------------- */

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
            ckz_ctx_fill_uniform(freq);
        } else {
            if (p == end)
                return ckz_fail(err, "plane %u: truncated in the table of bucket %u", plane, b);
            ckz_ctx_fill_single(freq, *p++, shift);
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

/* ---- decode tables --------------------------------------------------------------------------- */

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

/* ---- header ---------------------------------------------------------------------------------- */

static int parse_ctx_header(const uint8_t *src, size_t len, ctx_header *h, ckz_err *err) {
    const uint8_t *p = src, *end = src + len;
    if (!len) return ckz_fail(err, "stream is empty");
    if (!ckz_is_ctx_format(*p))
        /* reader.NEWER_STREAM: this message's start marks a newer writer's stream */
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

/* ---- planes ---------------------------------------------------------------------------------- */

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
    if (!r->have_bk) ckz_ctx_bucket_index(r->ctx, n, r->bs->first, B, r->bk), r->have_bk = 1;
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
 * placed by a byte shuffle (ckz_ctx_esc_unpack).  Those loads stay inside the planes while m + 32 <= mt,
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
        __m128i e_ = _mm_shuffle_epi8(b_, _mm_loadu_si128((const __m128i *)ckz_ctx_esc_unpack[bits_])); \
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
        ckz_ctx_find_buckets(ctx, n, &bs);
        if (h->buckets != bs.count) return ckz_ctx_bucket_mismatch(h->buckets, bs.count, err);
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
        size_t m = ckz_ctx_count_escapes(sym, NULL, n);
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
        if (ckz_ctx_decode_format2(&h, src + len, ctx, n, dst, elem_size, rotate, err)) return -1;
        if (base) ckz_residual_decode(dst, base, dst, n, elem_size, (unsigned)kind);
        return 0;
    }
    return decode_format34(&h, src + len, ctx, n, dst, elem_size, rotate, base, kind, err);
}
