/* ctx_encode.c - the context coder's encoder (ctx.h: ckz_encode_planes_ctx): the bucket tables
 * each plane is coded with, the plane modes picked by computed sizes, format 4's escapes taken
 * out of the top two planes (by hand with AVX2 and AVX-512 VBMI2), the planes coded with
 * ckz_rans32_encode_tab.
 */
#include "ctx_internal.h"

#include <math.h>
#include <stdlib.h>

#include "hist.h"
#include "memory.h"
#include "planes.h"

/* ---- bucket tables --------------------------------------------------------------------------- */

typedef struct {
    uint8_t kind, value, order; /* value: SINGLE; order: CODED */
    uint16_t freq[256];         /* the frequencies (summing to SCALE) the coder uses */
    double bits;                /* table and code bits of this bucket's bytes */
} bucket_table;

static unsigned bit_length(uint32_t v) { return v ? 32u - (unsigned)__builtin_clz(v) : 0; }

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
        ckz_ctx_fill_single(t->freq, lo, shift);
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
    ckz_ctx_fill_uniform(t->freq);
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

/* ---- planes ---------------------------------------------------------------------------------- */

/* Format 4 codes the top two bytes as a symbol and escapes only while at most 1 / MAX_ESCAPES_DEN
 * of a chunk's elements escape (else format 3: escapes, coded order 0, would cost more than the
 * bucketed high plane they replace). */
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

/* ---- format 4's escapes ---------------------------------------------------------------------- */

#if CKZ_DISPATCH
/* take_escapes (below), 64 elements a step: the escape mask by two compares, the escapes' bytes
 * (v - ESCAPE: low byte lo + 1, high byte hi - 1 unless lo is ESCAPE) out by byte compresses,
 * ESCAPE blended into lo.  Returns the elements done (whole steps); *m receives the escapes
 * taken. */
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

/* The AVX2 forms of take_words2_vbmi2 and take_words4_vbmi2, 32 words a step: the symbols by
 * saturating packs (which interleave 128-bit lanes, undone by one dword permute), the escapes
 * (3-12% of the elements on the GPT's deltas) packed 8 lanes at a time by byte shuffles
 * (ckz_ctx_esc_pack), each group storing 8 bytes to each plane of which the escapes keep theirs.  The
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
        __m128i b_ = _mm_shuffle_epi8((e), _mm_loadu_si128((const __m128i *)ckz_ctx_esc_pack[bits_])); \
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

/* Format 4's escapes: every element whose top two bytes (lo, hi planes) hold v >= ESCAPE gets
 * the symbol ESCAPE in lo, and v - ESCAPE goes to the escapes, its low byte to esc_lo and its
 * high byte to esc_hi, in element order.  Blocks of 16 without one are passed over. */
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

/* ---- the stream ------------------------------------------------------------------------------ */

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
    ckz_ctx_find_buckets(ctx, n, &bs);
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
        if (four) m = ckz_ctx_count_escapes(top - n, top, n);
        if (four && m * MAX_ESCAPES_DEN > n) four = 0, scratch = esc_lo;
    }
    ckz_ctx_bucket_index(ctx, n, bs.first, bs.count, bk);
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
