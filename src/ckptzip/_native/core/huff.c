/* huff.c - length-limited canonical Huffman, 4 interleaved LSB-first bitstreams, multi-symbol
 * decode table.  See huff.h for the contracts and the table entry layout.
 */
#include "huff.h"

#include <stdlib.h>
#if CKZ_DISPATCH
#include <immintrin.h>
#endif

#define MAX_BITS CKZ_HUF_MAX_BITS
#define TMASK (CKZ_HUF_TABLE_SIZE - 1)

/* A 64-bit peek at bit position p holds at least 64 - 7 = 57 valid bits, and a table lookup
 * consumes at most MAX_BITS of them, so one peek serves LOOKUPS_PER_PEEK lookups. */
#define LOOKUPS_PER_PEEK 5
_Static_assert(LOOKUPS_PER_PEEK * MAX_BITS <= 57, "a peek must cover every lookup it serves");
/* The most bytes one peek's lookups store: a multi-symbol lookup writes a full 32-bit word. */
#define PEEK_OUT_BYTES (LOOKUPS_PER_PEEK * CKZ_HUF_MULTI)
/* The multi-symbol table is used when the average code length implied by the lengths
 * (sum of len * 2^-len) is at most MULTI_MAX_AVG_BITS: then an 11-bit entry holds >= 2 codes. */
#define MULTI_MAX_AVG_BITS 5

/* ---- code lengths --------------------------------------------------------------------------- */

typedef struct {
    uint64_t key; /* count, then reused for tree links and depths */
    unsigned sym;
} symfreq;

static int cmp_symfreq(const void *a, const void *b) {
    const symfreq *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->sym < y->sym ? -1 : (x->sym > y->sym);
}

/* Moffat & Katajainen, "In-place calculation of minimum-redundancy codes" (1995): A[0..n) sorted
 * by ascending count; on return A[i].key is the optimal (unlimited) code length of A[i]. */
static void min_redundancy(symfreq *A, int n) {
    int root = 0, leaf = 2, next, avbl, used, dpth;
    A[0].key += A[1].key;
    for (next = 1; next < n - 1; next++) {
        if (leaf >= n || A[root].key < A[leaf].key) {
            A[next].key = A[root].key;
            A[root++].key = (uint64_t)next;
        } else {
            A[next].key = A[leaf++].key;
        }
        if (leaf >= n || (root < next && A[root].key < A[leaf].key)) {
            A[next].key += A[root].key;
            A[root++].key = (uint64_t)next;
        } else {
            A[next].key += A[leaf++].key;
        }
    }
    A[n - 2].key = 0;
    for (next = n - 3; next >= 0; next--) A[next].key = A[A[next].key].key + 1;
    avbl = 1;
    used = dpth = 0;
    root = n - 2;
    next = n - 1;
    while (avbl > 0) {
        while (root >= 0 && (int)A[root].key == dpth) { used++; root--; }
        while (avbl > used) { A[next--].key = (uint64_t)dpth; avbl--; }
        avbl = 2 * used;
        dpth++;
        used = 0;
    }
}

void ckz_huf_build_lengths(const uint64_t total[256], uint8_t len[256]) {
    symfreq A[256];
    int n = 0;
    for (unsigned s = 0; s < 256; s++)
        if (total[s]) A[n++] = (symfreq){total[s], s};
    qsort(A, (size_t)n, sizeof A[0], cmp_symfreq); /* ties by symbol: output is deterministic */
    min_redundancy(A, n);

    /* Length limit (as miniz's enforce_max_code_size): fold every code longer than MAX_BITS to
     * MAX_BITS, then, while the Kraft sum exceeds 1 (in units of 2^-MAX_BITS), move one leaf
     * down from the deepest level above MAX_BITS that has one.  Each move lowers the sum by one
     * unit, so the loop ends with a complete code. */
    unsigned num[256] = {0}; /* num[l]: codes of length l; unlimited lengths are < n <= 256 */
    for (int i = 0; i < n; i++) num[A[i].key]++;
    for (unsigned l = MAX_BITS + 1; l < 256; l++) num[MAX_BITS] += num[l];
    uint32_t kraft = 0;
    for (unsigned l = 1; l <= MAX_BITS; l++) kraft += num[l] << (MAX_BITS - l);
    while (kraft != (1u << MAX_BITS)) {
        num[MAX_BITS]--;
        for (unsigned l = MAX_BITS - 1; l > 0; l--)
            if (num[l]) { num[l]--; num[l + 1] += 2; break; }
        kraft--;
    }
    /* Shortest codes to the most frequent symbols (the end of A). */
    memset(len, 0, 256);
    int i = n - 1;
    for (unsigned l = 1; l <= MAX_BITS; l++)
        for (unsigned c = 0; c < num[l]; c++) len[A[i--].sym] = (uint8_t)l;
}

/* ---- table serialization -------------------------------------------------------------------- */

/* The range of symbols with a code: its first and its length. */
static void used_range(const uint8_t len[256], unsigned *first, unsigned *count) {
    unsigned hi;
    ckz_used_range(len, sizeof len[0], first, &hi);
    *count = hi - *first + 1;
}

size_t ckz_huf_table_size(const uint8_t len[256]) {
    unsigned first, count;
    used_range(len, &first, &count);
    return 2 + (count + 1) / 2;
}

size_t ckz_huf_write_table(const uint8_t len[256], uint8_t *out) {
    unsigned first, count;
    used_range(len, &first, &count);
    out[0] = (uint8_t)first;
    out[1] = (uint8_t)(count - 1);
    for (unsigned j = 0; j < count; j += 2) {
        unsigned hi = j + 1 < count ? len[first + j + 1] : 0;
        out[2 + j / 2] = (uint8_t)(len[first + j] | (hi << 4));
    }
    return 2 + (count + 1) / 2;
}

int ckz_huf_read_table(const uint8_t *in, size_t avail, uint8_t len[256], size_t *used_bytes,
                       ckz_err *err) {
    if (avail < 2) return ckz_fail(err, "huffman table: %zu bytes left, need 2", avail);
    unsigned first = in[0], count = (unsigned)in[1] + 1;
    if (first + count > 256)
        return ckz_fail(err, "huffman table: symbols %u..%u exceed 255", first,
                                first + count - 1);
    size_t size = 2 + (count + 1) / 2;
    if (avail < size)
        return ckz_fail(err, "huffman table: %zu bytes left, need %zu", avail, size);
    memset(len, 0, 256);
    uint32_t kraft = 0; /* in units of 2^-MAX_BITS; at most 256 * 2^(MAX_BITS-1): no overflow */
    unsigned used = 0;
    for (unsigned j = 0; j < count; j++) {
        unsigned l = (in[2 + j / 2] >> (4 * (j & 1))) & 15;
        if (l > MAX_BITS)
            return ckz_fail(err, "huffman table: symbol %u has length %u > %u",
                                    first + j, l, MAX_BITS);
        len[first + j] = (uint8_t)l;
        if (l) { kraft += 1u << (MAX_BITS - l); used++; }
    }
    /* The canonical form the encoder writes: range ends used, spare nibble zero. */
    if (!len[first] || !len[first + count - 1] || ((count & 1) && (in[size - 1] >> 4)))
        return ckz_fail(err, "huffman table: not in canonical form");
    if (used < 2 || kraft != (1u << MAX_BITS))
        return ckz_fail(err, "huffman table: %u symbols with Kraft sum %u/%u, need a "
                                "complete code of >= 2 symbols", used, kraft,
                                1u << MAX_BITS);
    *used_bytes = size;
    return 0;
}

/* ---- canonical codes ------------------------------------------------------------------------ */

/* code[s]: the canonical code of s, bit-reversed for LSB-first output (0 for unused symbols). */
static void canonical_codes(const uint8_t len[256], uint16_t code[256]) {
    unsigned bl_count[MAX_BITS + 1] = {0}, next[MAX_BITS + 2];
    for (unsigned s = 0; s < 256; s++) bl_count[len[s]]++;
    bl_count[0] = 0;
    next[1] = 0;
    for (unsigned l = 1; l <= MAX_BITS; l++) next[l + 1] = (next[l] + bl_count[l]) << 1;
    for (unsigned s = 0; s < 256; s++) {
        unsigned l = len[s], c = l ? next[l]++ : 0, r = 0;
        for (unsigned b = 0; b < l; b++) r |= ((c >> b) & 1) << (l - 1 - b);
        code[s] = (uint16_t)r;
    }
}

/* ---- encoder -------------------------------------------------------------------------------- */

size_t ckz_huf_stream_bytes(const uint32_t count[256], const uint8_t len[256]) {
    uint64_t bits = 0;
    for (unsigned s = 0; s < 256; s++) bits += (uint64_t)count[s] * len[s];
    return (size_t)((bits + 7) / 8);
}

/* ---- fixed-width codes ---------------------------------------------------------------------- */

/* L when every used code is L <= 8 bits long, else 0: a complete code of 2^L symbols (a flat
 * plane), whose stream is fields of L bits, code j at bits [j L, (j + 1) L) LSB first.  Both
 * directions then skip the bit buffer's bookkeeping (and with AVX-512 VBMI take 64 codes a step);
 * the streams are those of the generic coder, byte for byte. */
static unsigned fixed_code_bits(const uint8_t len[256]) {
    unsigned l0 = 0;
    for (unsigned s = 0; s < 256; s++)
        if (len[s]) {
            if (l0 && len[s] != l0) return 0;
            l0 = len[s];
        }
    return l0 <= 8 ? l0 : 0;
}

#if CKZ_DISPATCH
/* 64 codes of `bits` <= 7 bits a step: the field of each byte by two two-source byte permutes
 * (the table's halves) and a blend on the byte's top bit; pairs, quads and octets of fields
 * merged in 16-, 32- and 64-bit lanes (each lane's upper half shifted down onto the lower's
 * end); a byte permute packs each lane's `bits` bytes together and a masked store writes exactly
 * 8 * bits bytes.  Returns the codes done (a multiple of 64). */
CKZ_TARGET_V4 static size_t
encode_fixed_v4(const uint8_t *src, size_t count, const uint8_t field[256], unsigned bits,
                uint8_t *o) {
    uint8_t pack[64];
    for (unsigned k = 0; k < 64; k++) pack[k] = (uint8_t)(k < 8 * bits ? k / bits * 8 + k % bits : 0);
    const __m512i vpack = _mm512_loadu_si512(pack);
    const __m512i t0 = _mm512_loadu_si512(field), t1 = _mm512_loadu_si512(field + 64);
    const __m512i t2 = _mm512_loadu_si512(field + 128), t3 = _mm512_loadu_si512(field + 192);
    const __m128i by16 = _mm_cvtsi32_si128((int)(8 - bits));
    const __m128i by32 = _mm_cvtsi32_si128((int)(16 - 2 * bits));
    const __m128i by64 = _mm_cvtsi32_si128((int)(32 - 4 * bits));
    const __m512i lo16 = _mm512_set1_epi16(0x00ff), lo32 = _mm512_set1_epi32(0xffff);
    const __m512i lo64 = _mm512_set1_epi64(0xffffffffLL);
    const __mmask64 keep = bits == 8 ? ~0ull : (1ull << (8 * bits)) - 1;
    size_t j = 0;
    for (; j + 64 <= count; j += 64, o += 8 * bits) {
        __m512i s = _mm512_loadu_si512(src + j);
        __m512i low = _mm512_permutex2var_epi8(t0, s, t1), high = _mm512_permutex2var_epi8(t2, s, t3);
        __m512i f = _mm512_mask_blend_epi8(_mm512_movepi8_mask(s), low, high);
        f = _mm512_or_si512(_mm512_and_si512(f, lo16), _mm512_srl_epi16(_mm512_andnot_si512(lo16, f), by16));
        f = _mm512_or_si512(_mm512_and_si512(f, lo32), _mm512_srl_epi32(_mm512_andnot_si512(lo32, f), by32));
        f = _mm512_or_si512(_mm512_and_si512(f, lo64), _mm512_srl_epi64(_mm512_andnot_si512(lo64, f), by64));
        _mm512_mask_storeu_epi8(o, keep, _mm512_permutexvar_epi8(vpack, f));
    }
    return j;
}
#endif

/* One stream of `count` codes of `bits` bits: exactly (count * bits + 7) / 8 bytes at o, the
 * last padded with zero bits, nothing written past them. */
static void encode_fixed(const uint8_t *src, size_t count, const uint8_t field[256],
                         unsigned bits, uint8_t *o) {
    size_t j = 0;
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(V4) && bits <= 7) {
        j = encode_fixed_v4(src, count, field, bits, o);
        o += j / 8 * bits;
    }
#endif
    for (; j + 8 <= count; j += 8, o += bits) {
        uint64_t w = 0;
        for (unsigned u = 0; u < 8; u++) w |= (uint64_t)field[src[j + u]] << (u * bits);
        uint8_t tmp[8];
        ckz_store64(tmp, w);
        memcpy(o, tmp, bits);
    }
    uint64_t w = 0;
    unsigned c = 0;
    for (; j < count; j++) {
        w |= (uint64_t)field[src[j]] << c;
        c += bits;
    }
    for (; c > 0; c = c > 8 ? c - 8 : 0, w >>= 8) *o++ = (uint8_t)w;
}

/* Symbols still to come when the fast loop stores 8 bytes: they hold >= 64 bits (codes are >= 1
 * bit), so the 8-byte store never passes the stream's own end and never touches the next
 * stream, which is being written at the same time. */
#define ENC_FAST_MARGIN (64 + 4)

typedef struct {
    uint64_t b;   /* pending bits, LSB-first */
    unsigned c;   /* pending bit count: < 8 after a flush, < 8 + 4*MAX_BITS < 64 before */
    uint8_t *o;
} bitwriter;

/* Appends the codes of s[0..4) and flushes whole bytes with one 8-byte store. */
#define ENC_PUT4(w, s, enc)                                                                    \
    do {                                                                                       \
        for (unsigned u_ = 0; u_ < 4; u_++) {                                                  \
            uint32_t e_ = (enc)[(s)[u_]];                                                      \
            (w).b |= (uint64_t)(e_ & 0xffff) << (w).c;                                         \
            (w).c += e_ >> 16;                                                                 \
        }                                                                                      \
        ckz_store64((w).o, (w).b);                                                             \
        (w).o += (w).c >> 3;                                                                   \
        (w).b >>= (w).c & ~7u;                                                                 \
        (w).c &= 7;                                                                            \
    } while (0)

/* Codes src[i..n) into w byte-exactly, then pads the last byte with zeros. */
CKZ_INLINE void encode_finish(bitwriter w, const uint8_t *src, size_t i, size_t n,
                              const uint32_t enc[256]) {
    for (; i + ENC_FAST_MARGIN <= n; i += 4) ENC_PUT4(w, src + i, enc);
    for (; i < n; i++) {
        uint32_t e = enc[src[i]];
        w.b |= (uint64_t)(e & 0xffff) << w.c;
        w.c += e >> 16;
        for (; w.c >= 8; w.c -= 8, w.b >>= 8) *w.o++ = (uint8_t)w.b;
    }
    if (w.c) *w.o = (uint8_t)w.b;
}

CKZ_INLINE void encode_impl(const uint8_t *src, size_t n, const uint32_t enc[256],
                            const size_t size[CKZ_HUF_STREAMS], uint8_t *out) {
    const uint8_t *s0 = src, *s1 = src + ckz_quarter_start(n, 1);
    const uint8_t *s2 = src + ckz_quarter_start(n, 2), *s3 = src + ckz_quarter_start(n, 3);
    bitwriter w0 = {0, 0, out}, w1 = {0, 0, w0.o + size[0]};
    bitwriter w2 = {0, 0, w1.o + size[1]}, w3 = {0, 0, w2.o + size[2]};
    /* Four independent chains in lockstep over the positions every quarter has (the last
     * quarter is the shortest); scalars, not arrays, since byte stores may alias arrays. */
    size_t common = ckz_quarter_count(n, 3), i = 0;
    for (; i + ENC_FAST_MARGIN <= common; i += 4) {
        ENC_PUT4(w0, s0 + i, enc);
        ENC_PUT4(w1, s1 + i, enc);
        ENC_PUT4(w2, s2 + i, enc);
        ENC_PUT4(w3, s3 + i, enc);
    }
    encode_finish(w0, s0, i, ckz_quarter_count(n, 0), enc);
    encode_finish(w1, s1, i, ckz_quarter_count(n, 1), enc);
    encode_finish(w2, s2, i, ckz_quarter_count(n, 2), enc);
    encode_finish(w3, s3, i, common, enc);
}
CKZ_VERSIONED(encode, (const uint8_t *src, size_t n, const uint32_t enc[256],
                       const size_t size[CKZ_HUF_STREAMS], uint8_t *out),
              (src, n, enc, size, out))

void ckz_huf_encode(const uint8_t *src, size_t n, const uint8_t len[256],
                    const size_t size[CKZ_HUF_STREAMS], uint8_t *out) {
    uint16_t code[256];
    canonical_codes(len, code);
    unsigned bits = fixed_code_bits(len);
    if (bits) {
        uint8_t field[256];
        for (unsigned s = 0; s < 256; s++) field[s] = (uint8_t)code[s];
        for (unsigned k = 0; k < CKZ_HUF_STREAMS; out += size[k], k++)
            encode_fixed(src + ckz_quarter_start(n, k), ckz_quarter_count(n, k), field, bits,
                         out);
        return;
    }
    uint32_t enc[256]; /* code | length << 16: one load per symbol */
    for (unsigned s = 0; s < 256; s++) enc[s] = code[s] | ((uint32_t)len[s] << 16);
    encode(src, n, enc, size, out);
}

/* ---- decoder -------------------------------------------------------------------------------- */

#define E_NBITS(e) ((unsigned)(e) & 0xff)
#define E_NSYM(e) (((unsigned)(e) >> 8) & 0xff)
#define E_CUM(e, t) (((unsigned)((e) >> 16) >> (4 * (t))) & 15)
#define E_SYMS(e) ((uint32_t)((e) >> 32))

static uint64_t make_entry(unsigned nbits, unsigned nsym, unsigned cums, uint32_t syms) {
    return nbits | (nsym << 8) | ((uint64_t)(cums & 0xffff) << 16) | ((uint64_t)syms << 32);
}

void ckz_huf_build_dtable(const uint8_t len[256], ckz_huf_dtable *t) {
    uint16_t code[256], *single = t->single;
    canonical_codes(len, code);
    uint32_t avg = 0; /* sum of len * 2^(MAX_BITS - len): the implied mean, in 2^-MAX_BITS units */
    for (unsigned s = 0; s < 256; s++)
        if (len[s]) avg += (uint32_t)len[s] << (MAX_BITS - len[s]);
    t->use_multi = avg <= (uint32_t)MULTI_MAX_AVG_BITS << MAX_BITS;
    t->fixed_bits = fixed_code_bits(len);
    /* A complete code (validated by ckz_huf_read_table) fills every slot exactly once. */
    for (unsigned s = 0; s < 256; s++) {
        unsigned l = len[s];
        if (!l) continue;
        for (unsigned j = code[s]; j < CKZ_HUF_TABLE_SIZE; j += 1u << l)
            single[j] = (uint16_t)(s | (l << 8));
    }
    /* fixed-width codes: the symbol of each L-bit field (the single table's first 2^L slots) */
    for (unsigned f = 0; f < 256; f++)
        t->fixed_sym[f] = t->fixed_bits && f >> t->fixed_bits == 0 ? (uint8_t)single[f] : 0;
    /* Entry i decodes greedily up to CKZ_HUF_MULTI whole codes from the MAX_BITS bits of i.
     * After its first code (length l1) the remaining MAX_BITS - l1 known bits are i >> l1, an
     * index below i, whose entry (computed with zero bits above) is valid for exactly those of
     * its codes that end within the known bits: a prefix code decodes the same on any suffix. */
    if (!t->use_multi) return;
    {
        unsigned s = single[0] & 0xff, l = single[0] >> 8, nsym = 0, cum = 0, cums = 0;
        uint32_t syms = 0;
        while (nsym < CKZ_HUF_MULTI && cum + l <= MAX_BITS) {
            syms |= (uint32_t)s << (8 * nsym);
            cum += l;
            cums |= cum << (4 * nsym);
            nsym++;
        }
        t->multi[0] = make_entry(cum, nsym, cums, syms);
    }
    for (unsigned i = 1; i < CKZ_HUF_TABLE_SIZE; i++) {
        unsigned s1 = single[i] & 0xff, l1 = single[i] >> 8, rem = MAX_BITS - l1;
        uint64_t r = t->multi[i >> l1]; /* i >> l1 < i since l1 >= 1 */
        unsigned k = 0, nr = E_NSYM(r);
        while (k < CKZ_HUF_MULTI - 1 && k < nr && E_CUM(r, k) <= rem) k++;
        unsigned cums = l1;
        for (unsigned u = 0; u < k; u++) cums |= (l1 + E_CUM(r, u)) << (4 * (u + 1));
        unsigned nbits = l1 + (k ? E_CUM(r, k - 1) : 0);
        t->multi[i] = make_entry(nbits, 1 + k, cums, s1 | (E_SYMS(r) << 8));
    }
}

/* Bytes of a stream at byte offset `at`, zero past its end: the slow path's peek. */
CKZ_INLINE uint64_t load64_safe(const uint8_t *base, size_t size, size_t at) {
    uint8_t tmp[8] = {0};
    if (at < size) memcpy(tmp, base + at, size - at < 8 ? size - at : 8);
    return ckz_load64(tmp);
}

/* One table lookup for one stream, the u-th of its peek: symbols to o, code bits consumed from
 * the peek.  Multi: a 32-bit word of symbols is stored (only E_NSYM of them real) and o moves
 * by E_NSYM.  Single: one symbol to o[u]; the caller moves o once per peek. */
#define LOOKUP(multi, T, pk, o, u, bitpos)                                                     \
    do {                                                                                       \
        if (multi) {                                                                           \
            uint64_t e_ = ((const uint64_t *)(T))[(pk) & TMASK];                               \
            ckz_store32((o), E_SYMS(e_));                                                      \
            (o) += E_NSYM(e_);                                                                 \
            (pk) >>= E_NBITS(e_);                                                              \
            (bitpos) += E_NBITS(e_);                                                           \
        } else {                                                                               \
            unsigned e_ = ((const uint16_t *)(T))[(pk) & TMASK];                               \
            (o)[u] = (uint8_t)e_;                                                              \
            (pk) >>= e_ >> 8;                                                                  \
            (bitpos) += e_ >> 8;                                                               \
        }                                                                                      \
    } while (0)

/* One peek's worth of lookups for one stream. */
#define DECODE_PEEK(multi, T, base, bitpos, o)                                                 \
    do {                                                                                       \
        uint64_t pk_ = ckz_load64((base) + ((bitpos) >> 3)) >> ((bitpos) & 7);                 \
        for (unsigned u_ = 0; u_ < LOOKUPS_PER_PEEK; u_++) LOOKUP(multi, T, pk_, o, u_, bitpos); \
        if (!(multi)) (o) += LOOKUPS_PER_PEEK;                                                 \
    } while (0)

/* Fast-path precondition: the 8-byte peek lies inside the stream, and the symbols it may yield
 * (PEEK_OUT_BYTES, all real since at least that many remain) fit before oend. */
CKZ_INLINE int fast_ok(size_t bitpos, size_t size, const uint8_t *o, const uint8_t *oend) {
    return (bitpos >> 3) + 8 <= size && (size_t)(oend - o) >= PEEK_OUT_BYTES;
}

/* Finishes one stream: fast peeks while they are safe, then one symbol per lookup (single table)
 * with zero-padded peeks.  A corrupt stream may run past its end; that reads zeros and is caught
 * by the caller.  Returns the final bit position. */
CKZ_INLINE size_t decode_rest(int multi, const void *T, const uint16_t *single,
                              const uint8_t *base, size_t size, size_t bitpos, uint8_t *o,
                              uint8_t *oend) {
    while (fast_ok(bitpos, size, o, oend)) DECODE_PEEK(multi, T, base, bitpos, o);
    while (o < oend) {
        uint64_t pk = load64_safe(base, size, bitpos >> 3) >> (bitpos & 7);
        for (unsigned u = 0; u < LOOKUPS_PER_PEEK && o < oend; u++, o++)
            LOOKUP(0, single, pk, o, 0, bitpos);
    }
    return bitpos;
}

/* Decodes every stream; bitpos[k] receives stream k's final bit position.  `multi` is a
 * constant at each call site, so each variant compiles to its own loop. */
CKZ_INLINE void decode_impl(int multi, const ckz_huf_dtable *t,
                            const uint8_t *const in[CKZ_HUF_STREAMS],
                            const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n,
                            size_t bitpos[CKZ_HUF_STREAMS]) {
    const void *T = multi ? (const void *)t->multi : (const void *)t->single;
    uint8_t *o[CKZ_HUF_STREAMS], *oend[CKZ_HUF_STREAMS];
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) {
        o[k] = out + ckz_quarter_start(n, k);
        oend[k] = o[k] + ckz_quarter_count(n, k);
    }
    /* Four independent chains in lockstep while every stream is far from both of its ends.  The
     * state lives in scalars: the symbol stores are byte stores, which may alias any array, so
     * array-held state would be reloaded after every store. */
    const uint8_t *in0 = in[0], *in1 = in[1], *in2 = in[2], *in3 = in[3];
    size_t bp0 = 0, bp1 = 0, bp2 = 0, bp3 = 0;
    uint8_t *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
    while (fast_ok(bp0, size[0], o0, oend[0]) && fast_ok(bp1, size[1], o1, oend[1]) &&
           fast_ok(bp2, size[2], o2, oend[2]) && fast_ok(bp3, size[3], o3, oend[3])) {
        DECODE_PEEK(multi, T, in0, bp0, o0);
        DECODE_PEEK(multi, T, in1, bp1, o1);
        DECODE_PEEK(multi, T, in2, bp2, o2);
        DECODE_PEEK(multi, T, in3, bp3, o3);
    }
    bitpos[0] = decode_rest(multi, T, t->single, in0, size[0], bp0, o0, oend[0]);
    bitpos[1] = decode_rest(multi, T, t->single, in1, size[1], bp1, o1, oend[1]);
    bitpos[2] = decode_rest(multi, T, t->single, in2, size[2], bp2, o2, oend[2]);
    bitpos[3] = decode_rest(multi, T, t->single, in3, size[3], bp3, o3, oend[3]);
}

#define DECODE_PARAMS                                                                          \
    (const ckz_huf_dtable *t, const uint8_t *const in[CKZ_HUF_STREAMS],                        \
     const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n, size_t bitpos[CKZ_HUF_STREAMS])
CKZ_INLINE void decode_multi_impl DECODE_PARAMS { decode_impl(1, t, in, size, out, n, bitpos); }
CKZ_INLINE void decode_single_impl DECODE_PARAMS { decode_impl(0, t, in, size, out, n, bitpos); }
CKZ_VERSIONED(decode_multi, DECODE_PARAMS, (t, in, size, out, n, bitpos))
CKZ_VERSIONED(decode_single, DECODE_PARAMS, (t, in, size, out, n, bitpos))

/* One stream of `count` codes all `bits` long (fixed_bits), exactly (count * bits + 7) / 8 bytes
 * (the caller checks): code j is bits [j * bits, (j + 1) * bits) of the stream, LSB first, and
 * its symbol single[field] (the table is indexed by the next bits, LSB first).  Eight codes
 * fill `bits` bytes, read with one load. */
#if CKZ_DISPATCH
/* AVX-512 VBMI, codes of at most 7 bits: 64 codes (8 groups of `bits` bytes) per step.  A byte
 * permute gives each 64-bit lane the 8 bytes from its group's start, a multishift takes code j
 * of the lane from bit j * bits, and a two-source byte permute looks the 128-entry table up.
 * Reads 64 bytes a step, so it stops 64 bytes before the stream's end; returns codes done. */
CKZ_TARGET_V4 static size_t
decode_fixed_v4(const uint8_t *in, size_t size, const uint8_t sym[128], unsigned bits,
                uint8_t *o, size_t count) {
    uint8_t spread[64], shifts[64];
    for (unsigned lane = 0; lane < 8; lane++)
        for (unsigned j = 0; j < 8; j++) {
            spread[8 * lane + j] = (uint8_t)(lane * bits + j);
            shifts[8 * lane + j] = (uint8_t)(j * bits);
        }
    const __m512i vspread = _mm512_loadu_si512(spread), vshift = _mm512_loadu_si512(shifts);
    const __m512i lo = _mm512_loadu_si512(sym), hi = _mm512_loadu_si512(sym + 64);
    const __m512i mask = _mm512_set1_epi8((char)((1u << bits) - 1));
    size_t j = 0;
    for (; j + 64 <= count && j / 8 * bits + 64 <= size; j += 64) {
        __m512i data = _mm512_loadu_si512(in + j / 8 * bits);
        __m512i lanes = _mm512_permutexvar_epi8(vspread, data);
        __m512i codes = _mm512_and_si512(_mm512_multishift_epi64_epi8(vshift, lanes), mask);
        _mm512_storeu_si512(o + j, _mm512_permutex2var_epi8(lo, codes, hi));
    }
    return j;
}
#endif

static void decode_fixed(const uint8_t *in, size_t size, const uint8_t sym[256], unsigned bits,
                         uint8_t *o, size_t count) {
    const unsigned mask = (1u << bits) - 1;
    size_t g = 0, groups = count / 8;
#if CKZ_DISPATCH
    if (CKZ_CPU_AT(V4) && bits <= 7) {
        g = decode_fixed_v4(in, size, sym, bits, o, count) / 8;
        o += 8 * g;
    }
#endif
    for (; g < groups && g * bits + 8 <= size; g++, o += 8) {
        uint64_t w = ckz_load64(in + g * bits);
        o[0] = sym[w & mask];
        o[1] = sym[(w >> bits) & mask];
        o[2] = sym[(w >> 2 * bits) & mask];
        o[3] = sym[(w >> 3 * bits) & mask];
        o[4] = sym[(w >> 4 * bits) & mask];
        o[5] = sym[(w >> 5 * bits) & mask];
        o[6] = sym[(w >> 6 * bits) & mask];
        o[7] = sym[(w >> 7 * bits) & mask];
    }
    for (size_t j = g * 8; j < count; j++, o++) {
        size_t bit = j * bits;
        *o = sym[(load64_safe(in, size, bit / 8) >> (bit % 8)) & mask];
    }
}

int ckz_huf_decode(const ckz_huf_dtable *t, const uint8_t *const in[CKZ_HUF_STREAMS],
                   const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n, ckz_err *err) {
    size_t bitpos[CKZ_HUF_STREAMS];
    if (t->fixed_bits) {
        /* the generic decoder's outcome: every code takes fixed_bits, so a stream is accepted
         * exactly when it has the bytes its count of codes fills */
        for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) {
            size_t count = ckz_quarter_count(n, k), bits = count * t->fixed_bits;
            if ((bits + 7) / 8 != size[k])
                return ckz_fail(err, "huffman stream %u: decoded %zu symbols from %zu bits but "
                                "the stream has %zu bytes", k, count, bits, size[k]);
        }
        for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++)
            decode_fixed(in[k], size[k], t->fixed_sym, t->fixed_bits,
                         out + ckz_quarter_start(n, k), ckz_quarter_count(n, k));
        return 0;
    }
    if (t->use_multi) decode_multi(t, in, size, out, n, bitpos);
    else decode_single(t, in, size, out, n, bitpos);
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) {
        /* Every stream must end in its last byte: its final code ends there, and no byte is
         * left over.  (bitpos <= 11 bits per symbol, far from overflow.) */
        if ((bitpos[k] + 7) / 8 != size[k])
            return ckz_fail(err, "huffman stream %u: decoded %zu symbols from %zu bits but the "
                            "stream has %zu bytes", k, ckz_quarter_count(n, k), bitpos[k],
                            size[k]);
    }
    return 0;
}
