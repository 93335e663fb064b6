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

#include <math.h>
#include <stdlib.h>

#define PROB_BITS CKZ_RANS_PROB_BITS
#define SCALE CKZ_RANS_PROB_SCALE
#define L CKZ_RANS_L

void ckz_rans_normalize_bits(const uint64_t total[256], uint64_t n, unsigned bits,
                             uint16_t freq[256]) {
    uint32_t scale = 1u << bits, sum = 0;
    unsigned top = 0;
    for (unsigned s = 0; s < 256; s++) {
        uint64_t f = total[s] ? total[s] * scale / n : 0; /* n <= 2^56: no overflow */
        if (total[s] && !f) f = 1;
        freq[s] = (uint16_t)f;
        sum += (uint32_t)f;
        if (total[s] > total[top]) top = s;
    }
    /* Rounding moved the sum off scale: the difference goes to or comes from the largest
     * frequencies, never taking one below 1 (>= 2 used symbols, each >= 1, and scale >= 256,
     * so this ends). */
    while (sum > scale) {
        unsigned big = 0;
        for (unsigned s = 1; s < 256; s++)
            if (freq[s] > freq[big]) big = s;
        uint32_t cut = sum - scale < freq[big] - 1u ? sum - scale : freq[big] - 1u;
        freq[big] = (uint16_t)(freq[big] - cut);
        sum -= cut;
    }
    freq[top] = (uint16_t)(freq[top] + (scale - sum));
}

void ckz_rans_normalize(const uint64_t total[256], uint64_t n, uint16_t freq[256]) {
    ckz_rans_normalize_bits(total, n, PROB_BITS, freq);
}

/* ---- table ---------------------------------------------------------------------------------- */

/* The range of symbols with a frequency: its first and its length. */
static void used_range(const uint16_t freq[256], unsigned *first, unsigned *count) {
    unsigned hi;
    ckz_used_range(freq, sizeof freq[0], first, &hi);
    *count = hi - *first + 1;
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

/* ---- decoder -------------------------------------------------------------------------------- */

void ckz_rans_build_dtable(const uint16_t freq[256], uint32_t T[SCALE]) {
    ckz_rans_build_dtable_unit(freq, 0, T);
}

void ckz_rans_build_dtable_unit(const uint16_t freq[256], unsigned shift, uint32_t *T) {
    uint32_t cum = 0; /* every entry is written once: the table reader checked the sum */
    for (unsigned s = 0; s < 256; s++) {
        uint32_t units = (uint32_t)freq[s] >> shift;
        for (uint32_t j = 0; j < units; j++)
            T[cum + j] = s | (j << shift << 8) | ((uint32_t)freq[s] << 20);
        cum += units;
    }
}

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
CKZ_INLINE void lockstep_impl(const uint32_t *T, const uint8_t *const in[CKZ_HIST_QUARTERS],
                              const size_t size[CKZ_HIST_QUARTERS], uint8_t *out, size_t n,
                              uint32_t xs[CKZ_HIST_QUARTERS], size_t pos[CKZ_HIST_QUARTERS],
                              size_t *done) {
    const uint8_t *p0 = in[0], *p1 = in[1], *p2 = in[2], *p3 = in[3];
    uint32_t x0 = ckz_load32(p0), x1 = ckz_load32(p1), x2 = ckz_load32(p2), x3 = ckz_load32(p3);
    size_t s0 = 4, s1 = 4, s2 = 4, s3 = 4, i = 0, common = ckz_quarter_count(n, 3);
    uint8_t *o0 = out, *o1 = out + ckz_quarter_start(n, 1);
    uint8_t *o2 = out + ckz_quarter_start(n, 2), *o3 = out + ckz_quarter_start(n, 3);
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
CKZ_VERSIONED(lockstep, (const uint32_t *T, const uint8_t *const in[CKZ_HIST_QUARTERS],
                         const size_t size[CKZ_HIST_QUARTERS], uint8_t *out, size_t n,
                         uint32_t xs[CKZ_HIST_QUARTERS], size_t pos[CKZ_HIST_QUARTERS],
                         size_t *done),
              (T, in, size, out, n, xs, pos, done))

int ckz_rans_decode(const uint16_t freq[256], const uint8_t *const in[CKZ_HIST_QUARTERS],
                    const size_t size[CKZ_HIST_QUARTERS], uint8_t *out, size_t n, ckz_err *err) {
    uint32_t T[SCALE];
    ckz_rans_build_dtable(freq, T);
    for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++)
        if (size[k] < 4)
            return ckz_fail(err, "rans stream %u has %zu bytes, fewer than its 4-byte state", k,
                            size[k]);
    uint32_t xs[CKZ_HIST_QUARTERS];
    size_t pos[CKZ_HIST_QUARTERS], i;
    lockstep(T, in, size, out, n, xs, pos, &i);
    for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++) {
        /* The rest of each stream, one bounds-checked byte at a time. */
        size_t count = ckz_quarter_count(n, k), ps = pos[k];
        uint32_t x = xs[k];
        const uint8_t *p = in[k];
        uint8_t *o = out + ckz_quarter_start(n, k);
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

/* ---- 32-lane interleaved rANS ---------------------------------------------------------------- */

#define LANES CKZ_RANS32_LANES

/* Both layouts share one implementation: `tab` is NULL for one table (RANS32), else symbol i
 * uses table tab[i] (bucketed RANS32): decode table T + tab[i] * (SCALE >> shift) (the tables'
 * frequencies are multiples of 2^shift, so an entry covers 2^shift slots: slot >> shift indexes
 * it, and the slot's low bits are added to its slot - c), encoder entries (tab[i] << 8) +
 * symbol.  The NULL cases (shift 0) are separate always-inline instances, so the one-table loops
 * carry no table index. */

/* Portable decoder from symbol i on: lanes' states x, words at in[*pos..len).  Returns -1 when a
 * refill finds no word left (the caller reports it). */
CKZ_INLINE int rans32_scalar(const uint32_t *T, const uint8_t *tab, unsigned shift,
                             uint32_t x[LANES], const uint8_t *in, size_t len, size_t *pos,
                             uint8_t *out, size_t i, size_t n) {
    size_t ps = *pos;
    for (; i < n; i++) {
        uint32_t xl = x[i % LANES], slot = xl & (SCALE - 1);
        uint32_t e = T[(tab ? (uint32_t)tab[i] << (PROB_BITS - shift) : 0) | slot >> shift];
        out[i] = (uint8_t)e;
        xl = (e >> 20) * (xl >> PROB_BITS) + ((e >> 8) & 0xfff) + (slot & ((1u << shift) - 1));
        if (xl < L) {
            if (len - ps < 2) return -1;
            xl = (xl << 16) | ckz_load16(in + ps);
            ps += 2;
        }
        x[i % LANES] = xl;
    }
    *pos = ps;
    return 0;
}

/* The vector encoders' entries of one table: fc[s] = f | c << 12 and (inv not NULL: the
 * AVX-512 encoder's) inv[s] = 1.0 / f (f = 1 for unused symbols, which never occur). */
static void enc_fill(const uint16_t freq[256], uint32_t fc[256], double *inv) {
    uint32_t cum = 0;
    for (unsigned s = 0; s < 256; s++) {
        uint32_t f = freq[s] ? freq[s] : 1;
        fc[s] = f | cum << 12;
        if (inv) inv[s] = 1.0 / f;
        cum += freq[s];
    }
}

#if CKZ_DISPATCH
#include <immintrin.h>

/* refill_rank[mask][j]: the rank of lane j among the refilling lanes of `mask` (lanes below j
 * that refill), i.e. which of the next words lane j takes.  Filled once by ckz_rans_init. */
static uint8_t refill_rank[256][8];
/* flush_lane[mask][t]: for the encoder, the lane whose word goes to position t of 8, so that the
 * flushing lanes of `mask` fill the top positions in lane order (the rest are don't-cares). */
static uint8_t flush_lane[256][8];

static void init_vec_tables(void) {
    for (unsigned mask = 0; mask < 256; mask++) {
        unsigned count = (unsigned)__builtin_popcount(mask), t = 8 - count;
        memset(flush_lane[mask], 0, 8);
        for (unsigned j = 0, rank = 0; j < 8; j++) {
            refill_rank[mask][j] = (uint8_t)rank;
            rank += (mask >> j) & 1;
            if ((mask >> j) & 1) flush_lane[mask][t++] = (uint8_t)j;
        }
    }
}

/* Eight table indices, each tab[j] << shift (zero without tables). */
CKZ_INLINE_V3 __m256i table_offsets(const uint8_t *tab, __m128i shift) {
    if (!tab) return _mm256_setzero_si256();
    return _mm256_sll_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)tab)), shift);
}

/* One AVX2 step: 8 lanes decode one symbol each, and the lanes whose state fell below L take
 * the next words in lane order (refill_rank permutes them into place).  Reads 16 bytes at *p;
 * consumes 2 per refilling lane.  hi: each lane's table offset (a multiple of SCALE). */
CKZ_INLINE_V3 __m256i rans32_step8(const uint32_t *T, __m256i x, __m256i hi, int tabbed,
                                   __m128i shift, __m256i low, const uint8_t **p, uint8_t *out) {
    const __m256i slot_mask = _mm256_set1_epi32(SCALE - 1), lo12 = _mm256_set1_epi32(0xfff);
    __m256i slot = _mm256_and_si256(x, slot_mask);
    __m256i e = _mm256_i32gather_epi32(
        (const int *)T, tabbed ? _mm256_or_si256(_mm256_srl_epi32(slot, shift), hi) : slot, 4);
    __m256i f = _mm256_srli_epi32(e, 20), bias = _mm256_and_si256(_mm256_srli_epi32(e, 8), lo12);
    if (tabbed) bias = _mm256_add_epi32(bias, _mm256_and_si256(slot, low));
    /* f <= 2^12 - 1 and x >> 12 < 2^20: the product fits 32 bits, and so does the sum (it is
     * below f * ((x >> 12) + 1) <= 2^32). */
    x = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, PROB_BITS)), bias);
    /* symbols: byte 0 of each lane */
    __m256i sym = _mm256_shuffle_epi8(e, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1,
                                                          -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1,
                                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    uint32_t lo = (uint32_t)_mm256_extract_epi32(sym, 0), hi4 = (uint32_t)_mm256_extract_epi32(sym, 4);
    ckz_store64(out, (uint64_t)lo | (uint64_t)hi4 << 32);
    __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
    unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)refill_rank[mask]));
    __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)*p));
    words = _mm256_permutevar8x32_epi32(words, idx);
    x = _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), words), need);
    *p += 2 * (size_t)__builtin_popcount(mask);
    return x;
}

/* Whole 32-symbol rounds while the words in hand [p, end) cover one (a round reads <= 64 bytes:
 * 4 steps of <= 16 bytes, each loading 16 bytes at its start).  Returns symbols decoded. */
CKZ_INLINE_V3 size_t rans32_avx2_impl(const uint32_t *T, const uint8_t *tab, unsigned shift,
                                      uint32_t x[LANES], const uint8_t **pp, const uint8_t *end,
                                      uint8_t *out, size_t i, size_t n) {
    const __m128i sh = _mm_cvtsi32_si128((int)shift), tsh = _mm_cvtsi32_si128(PROB_BITS - (int)shift);
    const __m256i low = _mm256_set1_epi32((int)((1u << shift) - 1));
    __m256i x0 = _mm256_loadu_si256((const __m256i *)x),
            x1 = _mm256_loadu_si256((const __m256i *)(x + 8)),
            x2 = _mm256_loadu_si256((const __m256i *)(x + 16)),
            x3 = _mm256_loadu_si256((const __m256i *)(x + 24));
    const uint8_t *p = *pp;
    size_t start = i;
    for (; n - i >= LANES && end - p >= 4 * 16; i += LANES) {
        x0 = rans32_step8(T, x0, table_offsets(tab ? tab + i : NULL, tsh), tab != NULL, sh, low,
                          &p, out + i);
        x1 = rans32_step8(T, x1, table_offsets(tab ? tab + i + 8 : NULL, tsh), tab != NULL, sh,
                          low, &p, out + i + 8);
        x2 = rans32_step8(T, x2, table_offsets(tab ? tab + i + 16 : NULL, tsh), tab != NULL, sh,
                          low, &p, out + i + 16);
        x3 = rans32_step8(T, x3, table_offsets(tab ? tab + i + 24 : NULL, tsh), tab != NULL, sh,
                          low, &p, out + i + 24);
    }
    _mm256_storeu_si256((__m256i *)x, x0);
    _mm256_storeu_si256((__m256i *)(x + 8), x1);
    _mm256_storeu_si256((__m256i *)(x + 16), x2);
    _mm256_storeu_si256((__m256i *)(x + 24), x3);
    *pp = p;
    return i - start;
}

CKZ_TARGET_V3 static size_t
rans32_avx2(const uint32_t *T, uint32_t x[LANES], const uint8_t **pp, const uint8_t *end,
            uint8_t *out, size_t i, size_t n) {
    return rans32_avx2_impl(T, NULL, 0, x, pp, end, out, i, n);
}

CKZ_TARGET_V3 static size_t
rans32_avx2_tab(const uint32_t *T, const uint8_t *tab, unsigned shift, uint32_t x[LANES],
                const uint8_t **pp, const uint8_t *end, uint8_t *out, size_t i, size_t n) {
    return rans32_avx2_impl(T, tab, shift, x, pp, end, out, i, n);
}

/* One AVX2 encoder step for 8 lanes (symbols sym[0..8), tables tab[0..8) or none), the inverse
 * of rans32_step8.  fc[e] = f | c << 12 for entry e = table * 256 + symbol
 * (f = 1 for unused symbols, which never occur).  Flush the lanes with x >= f << 20 (= x_max),
 * their low words stored in lane order just below *p (16-byte store at *p - 16: scratch keeps
 * that slack), then x = (x / f) << 12 + x % f + c.  The quotient is a double division (on Zen 3
 * cheaper than gathering 1/f, as the AVX-512 encoder does); see below why it is exact. */
CKZ_INLINE_V3 __m256i rans32_put8(const uint32_t *fc, __m256i x,
                                  const uint8_t *sym, const uint8_t *tab, uint8_t **p) {
    __m256i s = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sym)),
                                table_offsets(tab, _mm_cvtsi32_si128(8)));
    __m256i e = _mm256_i32gather_epi32((const int *)fc, s, 4);
    __m256i f = _mm256_and_si256(e, _mm256_set1_epi32(0xfff)), c = _mm256_srli_epi32(e, 12);
    __m256i x_max = _mm256_slli_epi32(f, 20);
    __m256i flush = _mm256_cmpeq_epi32(_mm256_max_epu32(x, x_max), x);
    unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(flush));
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)flush_lane[mask]));
    __m256i w = _mm256_permutevar8x32_epi32(x, idx);
    w = _mm256_shuffle_epi8(w, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1,
                                                -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1,
                                                -1, -1, -1, -1));
    w = _mm256_permute4x64_epi64(w, 0x08); /* qwords 0 and 2: the 8 words in order */
    _mm_storeu_si128((__m128i *)(*p - 16), _mm256_castsi256_si128(w));
    *p -= 2 * (size_t)__builtin_popcount(mask);
    x = _mm256_blendv_epi8(x, _mm256_srli_epi32(x, 16), flush);
    const __m256d two31 = _mm256_set1_pd(2147483648.0);
    __m256i xs = _mm256_xor_si256(x, _mm256_set1_epi32((int)0x80000000u)); /* signed convert */
    __m256d lo = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(xs)), two31);
    __m256d hi = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(xs, 1)), two31);
    /* x / f, correctly rounded: after the flush x < f 2^20, so x / f < 2^20; a non-integer
     * quotient lies at least 1/f > 2^-12 below the next integer, far beyond the rounding error
     * (< 2^-32), and an integer one is exact, so truncation gives floor(x / f) */
    lo = _mm256_div_pd(lo, _mm256_cvtepi32_pd(_mm256_castsi256_si128(f)));
    hi = _mm256_div_pd(hi, _mm256_cvtepi32_pd(_mm256_extracti128_si256(f, 1)));
    __m256i q = _mm256_set_m128i(_mm256_cvttpd_epi32(hi), _mm256_cvttpd_epi32(lo));
    __m256i r = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, f)); /* q < 2^20, f < 2^12 */
    return _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(q, PROB_BITS), r), c);
}

/* Whole rounds [0, rounds) backwards (the encoder's order), the states in x; returns the new p. */
CKZ_INLINE_V3 uint8_t *rans32_encode_avx2_impl(const uint8_t *src, const uint8_t *tab,
                                               size_t rounds, const uint32_t *fc,
                                               uint32_t x[LANES], uint8_t *p) {
    __m256i x0 = _mm256_loadu_si256((const __m256i *)x),
            x1 = _mm256_loadu_si256((const __m256i *)(x + 8)),
            x2 = _mm256_loadu_si256((const __m256i *)(x + 16)),
            x3 = _mm256_loadu_si256((const __m256i *)(x + 24));
    for (size_t r = rounds; r-- > 0;) {
        const uint8_t *s = src + r * LANES, *t = tab ? tab + r * LANES : NULL;
        x3 = rans32_put8(fc, x3, s + 24, t ? t + 24 : NULL, &p);
        x2 = rans32_put8(fc, x2, s + 16, t ? t + 16 : NULL, &p);
        x1 = rans32_put8(fc, x1, s + 8, t ? t + 8 : NULL, &p);
        x0 = rans32_put8(fc, x0, s, t, &p);
    }
    _mm256_storeu_si256((__m256i *)x, x0);
    _mm256_storeu_si256((__m256i *)(x + 8), x1);
    _mm256_storeu_si256((__m256i *)(x + 16), x2);
    _mm256_storeu_si256((__m256i *)(x + 24), x3);
    return p;
}

/* The AVX-512 encoder's tables for one table (see rans32_put16). */
typedef struct {
    uint32_t fc[256];
    double inv[256];
} enc_vec_table;

CKZ_TARGET_V3 static uint8_t *
rans32_encode_avx2(const uint8_t *src, size_t rounds, const uint16_t freq[256],
                   uint32_t x[LANES], uint8_t *p) {
    uint32_t fc[256];
    enc_fill(freq, fc, NULL);
    return rans32_encode_avx2_impl(src, NULL, rounds, fc, x, p);
}

CKZ_TARGET_V3 static uint8_t *
rans32_encode_avx2_tab(const uint8_t *src, const uint8_t *tab, size_t rounds, const uint32_t *fc,
                       uint32_t x[LANES], uint8_t *p) {
    return rans32_encode_avx2_impl(src, tab, rounds, fc, x, p);
}

/* AVX-512 (F, BW, VL): 16 lanes a step, so a round of 32 symbols is two steps and the chain of
 * refill positions between steps is half as long.  The refill words go to the refilling lanes
 * by an expand (no permutation table); the encoder's flushed words leave by a compress and a
 * masked store of exactly their count.  Same streams, byte for byte, as the 8-lane steps: the
 * refills of a step still come in lane order. */

/* tab: NULL for one table; else each lane's table index tab[j], which moves its slot's entry
 * to T + (tab[j] << tsh) + (slot >> sh), the slot's low bits (low) added to its bias (as in
 * rans32_step8). */
CKZ_INLINE_V4 __m512i rans32_step16(const uint32_t *T, __m512i x, const uint8_t *tab, __m128i sh,
                                    __m128i tsh, __m512i low, const uint8_t **p, uint8_t *out) {
    __m512i slot = _mm512_and_si512(x, _mm512_set1_epi32(SCALE - 1)), index = slot;
    if (tab) {
        __m512i table = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)tab));
        index = _mm512_or_si512(_mm512_srl_epi32(slot, sh), _mm512_sll_epi32(table, tsh));
    }
    __m512i e = _mm512_i32gather_epi32(index, T, 4);
    __m512i f = _mm512_srli_epi32(e, 20);
    __m512i bias = _mm512_and_si512(_mm512_srli_epi32(e, 8), _mm512_set1_epi32(0xfff));
    if (tab) bias = _mm512_add_epi32(bias, _mm512_and_si512(slot, low));
    x = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_srli_epi32(x, PROB_BITS)), bias);
    _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(e)); /* the symbols: byte 0 of e */
    __mmask16 need = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(L));
    __m512i words = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)*p));
    x = _mm512_mask_or_epi32(x, need, _mm512_slli_epi32(x, 16),
                             _mm512_maskz_expand_epi32(need, words));
    *p += 2 * (size_t)__builtin_popcount(need);
    return x;
}

/* As rans32_avx2 (whole rounds while 64 bytes remain at p: two 32-byte loads a round). */
CKZ_INLINE_V4 size_t rans32_v4_impl(const uint32_t *T, const uint8_t *tab, unsigned shift,
                                    uint32_t x[LANES], const uint8_t **pp, const uint8_t *end,
                                    uint8_t *out, size_t i, size_t n) {
    const __m128i sh = _mm_cvtsi32_si128((int)shift);
    const __m128i tsh = _mm_cvtsi32_si128(PROB_BITS - (int)shift);
    const __m512i low = _mm512_set1_epi32((int)((1u << shift) - 1));
    __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 16);
    const uint8_t *p = *pp;
    size_t start = i;
    for (; n - i >= LANES && end - p >= 4 * 16; i += LANES) {
        x0 = rans32_step16(T, x0, tab ? tab + i : NULL, sh, tsh, low, &p, out + i);
        x1 = rans32_step16(T, x1, tab ? tab + i + 16 : NULL, sh, tsh, low, &p, out + i + 16);
    }
    _mm512_storeu_si512(x, x0);
    _mm512_storeu_si512(x + 16, x1);
    *pp = p;
    return i - start;
}

CKZ_TARGET_V4 static size_t rans32_v4(const uint32_t *T, uint32_t x[LANES], const uint8_t **pp,
                                      const uint8_t *end, uint8_t *out, size_t i, size_t n) {
    return rans32_v4_impl(T, NULL, 0, x, pp, end, out, i, n);
}

CKZ_TARGET_V4 static size_t rans32_v4_tab(const uint32_t *T, const uint8_t *tab, unsigned shift,
                                          uint32_t x[LANES], const uint8_t **pp,
                                          const uint8_t *end, uint8_t *out, size_t i, size_t n) {
    return rans32_v4_impl(T, tab, shift, x, pp, end, out, i, n);
}

/* Two streams, each with its table indices (the same for two planes of one chunk; two halves of
 * one plane; NULL: one table each, as the same plane of two chunks), decoded in one loop over
 * their first n symbols while both have 64 bytes in hand: four independent state chains instead
 * of two, so that one stream's gathers and refills overlap the other's latencies. */
CKZ_TARGET_V4 static size_t
rans32_v4_tab2(const uint32_t *TA, const uint32_t *TB, const uint8_t *tab_a,
               const uint8_t *tab_b, unsigned shift_a, unsigned shift_b,
               uint32_t xa[LANES],
               uint32_t xb[LANES], const uint8_t **ppa, const uint8_t *end_a,
               const uint8_t **ppb, const uint8_t *end_b, uint8_t *out_a,
               uint8_t *out_b, size_t n) {
    const __m128i sha = _mm_cvtsi32_si128((int)shift_a), shb = _mm_cvtsi32_si128((int)shift_b);
    const __m128i tsha = _mm_cvtsi32_si128(PROB_BITS - (int)shift_a);
    const __m128i tshb = _mm_cvtsi32_si128(PROB_BITS - (int)shift_b);
    const __m512i lowa = _mm512_set1_epi32((int)((1u << shift_a) - 1));
    const __m512i lowb = _mm512_set1_epi32((int)((1u << shift_b) - 1));
    __m512i a0 = _mm512_loadu_si512(xa), a1 = _mm512_loadu_si512(xa + 16);
    __m512i b0 = _mm512_loadu_si512(xb), b1 = _mm512_loadu_si512(xb + 16);
    const uint8_t *pa = *ppa, *pb = *ppb;
    size_t i = 0;
    for (; n - i >= LANES && end_a - pa >= 4 * 16 && end_b - pb >= 4 * 16; i += LANES) {
        const uint8_t *ta = tab_a ? tab_a + i : NULL, *tb = tab_b ? tab_b + i : NULL;
        a0 = rans32_step16(TA, a0, ta, sha, tsha, lowa, &pa, out_a + i);
        b0 = rans32_step16(TB, b0, tb, shb, tshb, lowb, &pb, out_b + i);
        a1 = rans32_step16(TA, a1, ta ? ta + 16 : NULL, sha, tsha, lowa, &pa, out_a + i + 16);
        b1 = rans32_step16(TB, b1, tb ? tb + 16 : NULL, shb, tshb, lowb, &pb, out_b + i + 16);
    }
    _mm512_storeu_si512(xa, a0);
    _mm512_storeu_si512(xa + 16, a1);
    _mm512_storeu_si512(xb, b0);
    _mm512_storeu_si512(xb + 16, b1);
    *ppa = pa, *ppb = pb;
    return i;
}

/* Renormalize 16 states before coding symbols of frequency f: the lanes with x >= f 2^20 write
 * their low 16 bits (packed by a compress, one masked store) and shift them out. */
CKZ_INLINE_V4 __m512i rans32_flush16(__m512i x, __m512i f, uint8_t **p) {
    __mmask16 flush = _mm512_cmpge_epu32_mask(x, _mm512_slli_epi32(f, 20));
    unsigned count = (unsigned)__builtin_popcount(flush);
    __m256i w = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(flush, x));
    *p -= 2 * (size_t)count;
    _mm256_mask_storeu_epi16(*p, (__mmask16)((1u << count) - 1), w);
    return _mm512_mask_srli_epi32(x, flush, x, 16);
}

/* The coded states (x / f) 2^PROB_BITS + x mod f + c of 16 flushed states, with 1/f of the
 * low and high 8 lanes in inv_lo and inv_hi: q = floor(x / f) from doubles, as in
 * rans32_put8 (x < f 2^20 after the flush); the fused multiply-add rounds once, so its error is
 * smaller still. */
CKZ_INLINE_V4 __m512i
rans32_code16(__m512i x, __m512i f, __m512i c, __m512d inv_lo, __m512d inv_hi) {
    const __m512d eps = _mm512_set1_pd(0x1p-24);
    __m512d lo = _mm512_fmadd_pd(_mm512_cvtepu32_pd(_mm512_castsi512_si256(x)), inv_lo, eps);
    __m512d hi = _mm512_fmadd_pd(_mm512_cvtepu32_pd(_mm512_extracti64x4_epi64(x, 1)), inv_hi, eps);
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvttpd_epu32(lo)),
                                   _mm512_cvttpd_epu32(hi), 1);
    __m512i r = _mm512_sub_epi32(x, _mm512_mullo_epi32(q, f));
    return _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(q, PROB_BITS), r), c);
}

/* tab: NULL for one table; else entry tab[j] * 256 + symbol of the tables fc and inv. */
CKZ_INLINE_V4 __m512i rans32_put16(const uint32_t *fc, const double *inv, __m512i x,
                                   const uint8_t *sym, const uint8_t *tab, uint8_t **p) {
    __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sym));
    if (tab)
        s = _mm512_or_si512(
            s, _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)tab)), 8));
    __m512i e = _mm512_i32gather_epi32(s, fc, 4);
    __m512i f = _mm512_and_si512(e, _mm512_set1_epi32(0xfff)), c = _mm512_srli_epi32(e, 12);
    x = rans32_flush16(x, f, p);
    return rans32_code16(x, f, c, _mm512_i32gather_pd(_mm512_castsi512_si256(s), inv, 8),
                         _mm512_i32gather_pd(_mm512_extracti64x4_epi64(s, 1), inv, 8));
}

/* The symbols of a plane whose used values span at most 32 (bf16 exponent planes: every chunk of
 * the GPT's weights, 97% of MiniLM's) find f, c and 1/f in registers (two-source permutes of
 * tables of 32) instead of three gathers per 16 symbols. */
CKZ_INLINE_V4 __m512i rans32_put16_reg(__m512i fc_lo, __m512i fc_hi, const __m512d inv[4],
                                       __m512i first, __m512i x, const uint8_t *sym, uint8_t **p) {
    __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sym));
    s = _mm512_sub_epi32(s, first);
    __m512i e = _mm512_permutex2var_epi32(fc_lo, s, fc_hi);
    __m512i f = _mm512_and_si512(e, _mm512_set1_epi32(0xfff)), c = _mm512_srli_epi32(e, 12);
    x = rans32_flush16(x, f, p);
    /* 1/f of each lane: indices 0-15 from inv[0..1], 16-31 from inv[2..3] (bit 4 picks) */
    __m512i s_lo = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(s));
    __m512i s_hi = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(s, 1));
    const __m512i bit4 = _mm512_set1_epi64(16);
    __m512d r_lo = _mm512_mask_blend_pd(_mm512_test_epi64_mask(s_lo, bit4),
                                        _mm512_permutex2var_pd(inv[0], s_lo, inv[1]),
                                        _mm512_permutex2var_pd(inv[2], s_lo, inv[3]));
    __m512d r_hi = _mm512_mask_blend_pd(_mm512_test_epi64_mask(s_hi, bit4),
                                        _mm512_permutex2var_pd(inv[0], s_hi, inv[1]),
                                        _mm512_permutex2var_pd(inv[2], s_hi, inv[3]));
    return rans32_code16(x, f, c, r_lo, r_hi);
}

CKZ_TARGET_V4 static uint8_t *
rans32_encode_v4(const uint8_t *src, size_t rounds, const uint16_t freq[256],
                 uint32_t x[LANES], uint8_t *p) {
    enc_vec_table t;
    enc_fill(freq, t.fc, t.inv);
    unsigned first, last;
    ckz_used_range(freq, sizeof freq[0], &first, &last);
    __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 16);
    if (last - first < 32) {
        /* tables of the 32 values from first (past 255: never used, any entry) */
        uint32_t fc32[32];
        double inv32[32];
        for (unsigned j = 0; j < 32; j++) {
            fc32[j] = first + j < 256 ? t.fc[first + j] : 1;
            inv32[j] = first + j < 256 ? t.inv[first + j] : 1.0;
        }
        const __m512i fc_lo = _mm512_loadu_si512(fc32), fc_hi = _mm512_loadu_si512(fc32 + 16);
        const __m512d inv[4] = {_mm512_loadu_pd(inv32), _mm512_loadu_pd(inv32 + 8),
                                _mm512_loadu_pd(inv32 + 16), _mm512_loadu_pd(inv32 + 24)};
        const __m512i base = _mm512_set1_epi32((int)first);
        for (size_t r = rounds; r-- > 0;) {
            x1 = rans32_put16_reg(fc_lo, fc_hi, inv, base, x1, src + r * LANES + 16, &p);
            x0 = rans32_put16_reg(fc_lo, fc_hi, inv, base, x0, src + r * LANES, &p);
        }
    } else {
        for (size_t r = rounds; r-- > 0;) {
            x1 = rans32_put16(t.fc, t.inv, x1, src + r * LANES + 16, NULL, &p);
            x0 = rans32_put16(t.fc, t.inv, x0, src + r * LANES, NULL, &p);
        }
    }
    _mm512_storeu_si512(x, x0);
    _mm512_storeu_si512(x + 16, x1);
    return p;
}

CKZ_TARGET_V4 static uint8_t *
rans32_encode_v4_tab(const uint8_t *src, const uint8_t *tab, size_t rounds,
                     const uint32_t *fc, const double *inv, uint32_t x[LANES],
                     uint8_t *p) {
    __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 16);
    for (size_t r = rounds; r-- > 0;) {
        x1 = rans32_put16(fc, inv, x1, src + r * LANES + 16, tab + r * LANES + 16, &p);
        x0 = rans32_put16(fc, inv, x0, src + r * LANES, tab + r * LANES, &p);
    }
    _mm512_storeu_si512(x, x0);
    _mm512_storeu_si512(x + 16, x1);
    return p;
}
#endif

float ckz_rans_log2[SCALE + 1];

void ckz_rans_init(void) {
    for (unsigned f = 1; f <= SCALE; f++) ckz_rans_log2[f] = (float)log2((double)f);
#if CKZ_DISPATCH
    init_vec_tables();
#endif
}

/* Symbols the vector encoders take (whole rounds, where the CPU has AVX2); the scalar loop does
 * the symbols above them first. */
static size_t vector_symbols(size_t rounds) {
#if CKZ_DISPATCH
    return CKZ_CPU_AT(V3) ? rounds * LANES : 0;
#else
    (void)rounds;
    return 0;
#endif
}

void ckz_rans_encode(const uint8_t *src, size_t n, const uint16_t freq[256], uint8_t *scratch,
                     const uint8_t *start[CKZ_HIST_QUARTERS], size_t size[CKZ_HIST_QUARTERS]) {
    uint32_t fc[256];
    enc_fill(freq, fc, NULL);
    /* Quarter 3 first, each backwards from where the next one starts: the decoder reads a
     * quarter's words forwards in symbol order, and the streams end up back to back.  The step
     * is the bucketed encoder's scalar one (plain division: these segments are small). */
    uint8_t *p = scratch + ckz_rans_scratch_size(n);
    for (unsigned k = CKZ_HIST_QUARTERS; k-- > 0;) {
        const uint8_t *q = src + ckz_quarter_start(n, k), *end = p;
        uint32_t x = L;
        for (size_t j = ckz_quarter_count(n, k); j-- > 0;) {
            uint32_t e = fc[q[j]], f = e & 0xfff;
            if (x >= f << 20) { /* x_max: a word out keeps x < 2^32 below */
                p -= 2;
                p[0] = (uint8_t)x;
                p[1] = (uint8_t)(x >> 8);
                x >>= 16;
            }
            uint32_t quot = x / f;
            x = (quot << PROB_BITS) + (x - quot * f) + (e >> 12);
        }
        p -= 4;
        ckz_store32(p, x);
        start[k] = p;
        size[k] = (size_t)(end - p);
    }
}

/* Writes the final states in front of the words at p (the stream's start) and its extent. */
static void put_states(const uint32_t x[LANES], uint8_t *p, const uint8_t *end,
                       const uint8_t **start, size_t *size) {
    p -= CKZ_RANS32_STATE_BYTES;
    for (unsigned l = 0; l < LANES; l++) ckz_store32(p + 4 * l, x[l]);
    *start = p;
    *size = (size_t)(end - p);
}

void ckz_rans32_encode(const uint8_t *src, size_t n, const uint16_t freq[256], uint8_t *scratch,
                       const uint8_t **start, size_t *size) {
    enc_sym es[256];
    uint32_t cum = 0;
    for (unsigned s = 0; s < 256; s++) {
        enc_sym_init(&es[s], cum, freq[s] ? freq[s] : 1);
        cum += freq[s];
    }
    uint32_t x[LANES];
    for (unsigned l = 0; l < LANES; l++) x[l] = L;
    /* Backwards over the symbols, words written backwards from the end: the decoder reads them
     * forwards in symbol order.  The last n % LANES symbols go first, one at a time, then whole
     * rounds (vectorized where the CPU allows).  The scalar flush is branch-free: the word is
     * always stored below p (scratch keeps slack for that) and p moves only when the flush
     * happens; a branch would mispredict on the ~H/16 of symbols that flush. */
    uint8_t *end = scratch + ckz_rans32_scratch_size(n), *p = end;
    size_t i = n, rounds = n / LANES;
    size_t stop = vector_symbols(rounds);
    for (; i > stop; i--) {
        const enc_sym *e = &es[src[i - 1]];
        uint32_t xl = x[(i - 1) % LANES], flush = xl >= e->x_max;
        p[-2] = (uint8_t)xl;
        p[-1] = (uint8_t)(xl >> 8);
        p -= 2 * flush;
        xl >>= 16 * flush;
        uint32_t q = (uint32_t)(((unsigned __int128)xl * e->rcp_freq) >> 64 >> e->rcp_shift);
        x[(i - 1) % LANES] = xl + e->bias + q * e->cmpl_freq;
    }
#if CKZ_DISPATCH
    if (stop)
        p = CKZ_CPU_AT(V4) ? rans32_encode_v4(src, rounds, freq, x, p)
                       : rans32_encode_avx2(src, rounds, freq, x, p);
#endif
    put_states(x, p, end, start, size);
}

int ckz_rans32_encode_tab(const uint8_t *src, const uint8_t *tab, size_t n,
                          const uint16_t (*freq)[256], unsigned tables, uint8_t *scratch,
                          const uint8_t **start, size_t *size) {
    /* fc of every (table, symbol) entry, and inv for the AVX-512 encoder (rans32_put16) */
    uint32_t *fc = malloc((size_t)tables * 256 * (sizeof *fc + sizeof(double)));
    if (!fc) return -1;
    double *inv = (double *)(fc + (size_t)tables * 256); /* tables * 256 is even: aligned */
    for (unsigned t = 0; t < tables; t++)
        enc_fill(freq[t], fc + (size_t)t * 256, CKZ_CPU_AT(V4) ? inv + (size_t)t * 256 : NULL);
    uint32_t x[LANES];
    for (unsigned l = 0; l < LANES; l++) x[l] = L;
    uint8_t *end = scratch + ckz_rans32_scratch_size(n), *p = end;
    size_t i = n, rounds = n / LANES;
    size_t stop = vector_symbols(rounds);
    /* The scalar steps (the tail, or everything without AVX2) divide directly: the result is
     * the same state as the reciprocal and double paths compute. */
    for (; i > stop; i--) {
        uint32_t e = fc[(uint32_t)tab[i - 1] << 8 | src[i - 1]], f = e & 0xfff;
        uint32_t xl = x[(i - 1) % LANES], flush = xl >= f << 20;
        p[-2] = (uint8_t)xl;
        p[-1] = (uint8_t)(xl >> 8);
        p -= 2 * flush;
        xl >>= 16 * flush;
        uint32_t q = xl / f;
        x[(i - 1) % LANES] = (q << PROB_BITS) + (xl - q * f) + (e >> 12);
    }
#if CKZ_DISPATCH
    if (stop)
        p = CKZ_CPU_AT(V4) ? rans32_encode_v4_tab(src, tab, rounds, fc, inv, x, p)
                       : rans32_encode_avx2_tab(src, tab, rounds, fc, x, p);
#endif
    free(fc);
    put_states(x, p, end, start, size);
    return 0;
}

/* Decodes with tables T (tab NULL: one table) from in[0..len) into out[i..n), the states x and
 * the stream position pos (>= the state bytes) where symbols 0..i left them. */
CKZ_INLINE int rans32_finish(const uint32_t *T, const uint8_t *tab, unsigned shift,
                             uint32_t x[LANES], const uint8_t *in, size_t len, size_t pos,
                             uint8_t *out, size_t i, size_t n, ckz_err *err) {
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(V3)) {
        /* In place while 64 bytes remain, then the last < 64 bytes from a zero-padded copy, so
         * the 16-byte loads never leave the buffer.  A round that runs past the real end (a
         * corrupt stream) stops the loop, and the final position check reports it. */
        const uint8_t *p = in + pos;
        if (CKZ_CPU_AT(V4))
            i += tab ? rans32_v4_tab(T, tab, shift, x, &p, in + len, out, i, n)
                     : rans32_v4(T, x, &p, in + len, out, i, n);
        else
            i += tab ? rans32_avx2_tab(T, tab, shift, x, &p, in + len, out, i, n)
                     : rans32_avx2(T, x, &p, in + len, out, i, n);
        uint8_t tail[2 * 4 * 16] = {0};
        size_t rest = (size_t)(in + len - p); /* < 64 unless the symbols ran out first */
        if (rest < 4 * 16 && n - i >= LANES) {
            memcpy(tail, p, rest);
            const uint8_t *q = tail;
            while (n - i >= LANES && q <= tail + rest) {
                const uint8_t *q_end = tail + rest + 4 * 16; /* loads stay inside tail */
                if (CKZ_CPU_AT(V4))
                    i += tab ? rans32_v4_tab(T, tab, shift, x, &q, q_end, out, i, i + LANES)
                             : rans32_v4(T, x, &q, q_end, out, i, i + LANES);
                else
                    i += tab ? rans32_avx2_tab(T, tab, shift, x, &q, q_end, out, i, i + LANES)
                             : rans32_avx2(T, x, &q, q_end, out, i, i + LANES);
            }
            if (q > tail + rest)
                return ckz_fail(err, "rans32 stream ends %zu bytes early", (size_t)(q - tail) - rest);
            p += q - tail;
        }
        pos = (size_t)(p - in);
    }
#endif
    if (rans32_scalar(T, tab, shift, x, in, len, &pos, out, i, n))
        return ckz_fail(err, "rans32 stream ends before symbol %zu of %zu", i, n);
    for (unsigned l = 0; l < LANES; l++)
        if (x[l] != L)
            return ckz_fail(err, "rans32 lane %u: final state 0x%08x (expected 0x%08x)", l, x[l],
                            L);
    if (pos != len)
        return ckz_fail(err, "rans32 stream: %zu of %zu bytes used", pos, len);
    return 0;
}

/* Decodes with tables T (tab NULL: one table) from in[0..len) into out[0..n). */
CKZ_INLINE int rans32_decode_impl(const uint32_t *T, const uint8_t *tab, unsigned shift,
                                  const uint8_t *in, size_t len, uint8_t *out, size_t n,
                                  ckz_err *err) {
    if (len < CKZ_RANS32_STATE_BYTES)
        return ckz_fail(err, "rans32 stream has %zu bytes, fewer than its %d state bytes", len,
                        CKZ_RANS32_STATE_BYTES);
    uint32_t x[LANES];
    for (unsigned l = 0; l < LANES; l++) x[l] = ckz_load32(in + 4 * l);
    return rans32_finish(T, tab, shift, x, in, len, CKZ_RANS32_STATE_BYTES, out, 0, n, err);
}

int ckz_rans32_decode(const uint16_t freq[256], const uint8_t *in, size_t len, uint8_t *out,
                      size_t n, ckz_err *err) {
    uint32_t T[SCALE];
    ckz_rans_build_dtable(freq, T);
    return rans32_decode_impl(T, NULL, 0, in, len, out, n, err);
}

int ckz_rans32_decode_tab(const uint32_t *T, const uint8_t *tab, unsigned shift,
                          const uint8_t *in, size_t len, uint8_t *out, size_t n, ckz_err *err) {
    return rans32_decode_impl(T, tab, shift, in, len, out, n, err);
}

int ckz_rans32_decode_tab2x(const uint32_t *const T[2], const uint8_t *const tab[2],
                            const unsigned shift[2], const uint8_t *const in[2],
                            const size_t len[2], uint8_t *const out[2], const size_t n[2],
                            ckz_err *err) {
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(V4) && len[0] >= CKZ_RANS32_STATE_BYTES && len[1] >= CKZ_RANS32_STATE_BYTES) {
        uint32_t xa[LANES], xb[LANES];
        for (unsigned l = 0; l < LANES; l++) {
            xa[l] = ckz_load32(in[0] + 4 * l);
            xb[l] = ckz_load32(in[1] + 4 * l);
        }
        const uint8_t *pa = in[0] + CKZ_RANS32_STATE_BYTES, *pb = in[1] + CKZ_RANS32_STATE_BYTES;
        size_t i = rans32_v4_tab2(T[0], T[1], tab[0], tab[1], shift[0], shift[1], xa, xb, &pa,
                                  in[0] + len[0], &pb, in[1] + len[1], out[0], out[1],
                                  n[0] < n[1] ? n[0] : n[1]);
        if (rans32_finish(T[0], tab[0], shift[0], xa, in[0], len[0], (size_t)(pa - in[0]),
                          out[0], i, n[0], err))
            return -1;
        return rans32_finish(T[1], tab[1], shift[1], xb, in[1], len[1], (size_t)(pb - in[1]),
                             out[1], i, n[1], err);
    }
#endif
    if (rans32_decode_impl(T[0], tab[0], shift[0], in[0], len[0], out[0], n[0], err)) return -1;
    return rans32_decode_impl(T[1], tab[1], shift[1], in[1], len[1], out[1], n[1], err);
}

int ckz_rans32_decode_tab2(const uint32_t *const T[2], const uint8_t *tab,
                           const unsigned shift[2], const uint8_t *const in[2],
                           const size_t len[2], uint8_t *const out[2], size_t n, ckz_err *err) {
    const uint8_t *tabs[2] = {tab, tab};
    const size_t counts[2] = {n, n};
    return ckz_rans32_decode_tab2x(T, tabs, shift, in, len, out, counts, err);
}
