/* ctx_internal.h - what the context coder's files share: the buckets, the bucket tables' kinds,
 * format 4's escapes and the parsed header.  Only ctx.c (the shared model), ctx_encode.c,
 * ctx_decode.c and ctx_format2.c include it; the core's interface is ctx.h.
 */
#ifndef CKZ_CTX_INTERNAL_H
#define CKZ_CTX_INTERNAL_H

#include <string.h>

#include "ctx.h"
#include "rans.h"

#if CKZ_DISPATCH /* (common.h, through ctx.h) */
#include <immintrin.h>
#elif defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#define PROB_BITS CKZ_RANS_PROB_BITS
#define SCALE CKZ_RANS_PROB_SCALE

/* Buckets of a context: B, sizes, each bucket's lowest context value. */
typedef struct {
    unsigned count;
    size_t size[CKZ_CTX_MAX_BUCKETS];
    uint8_t first[CKZ_CTX_MAX_BUCKETS];
} buckets;

/* The bucket rule on a context histogram h of n elements (ctx.c has it in full): sets size[b]
 * and first[b] (bucket b's lowest context value) and returns B. */
unsigned ckz_ctx_plan_buckets(const uint32_t h[256], size_t n, size_t size[CKZ_CTX_MAX_BUCKETS],
                              uint8_t first[CKZ_CTX_MAX_BUCKETS]);
/* The buckets of the context ctx[0..n) (format 3: the decoder recomputes them). */
void ckz_ctx_find_buckets(const uint8_t *ctx, size_t n, buckets *bs);
/* bk[i] = the bucket of ctx[i], for B buckets starting at first[0..B). */
void ckz_ctx_bucket_index(const uint8_t *ctx, size_t n, const uint8_t *first, unsigned B,
                          uint8_t *bk);

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

void ckz_ctx_fill_uniform(uint16_t freq[256]);
void ckz_ctx_fill_single(uint16_t freq[256], unsigned v, unsigned shift);

/* Format 4's escape symbol: the top two bytes' value v < ESCAPE is coded as the symbol v, a
 * larger one as ESCAPE and v - ESCAPE in the escapes' two planes. */
#define ESCAPE 255u

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

/* Elements of n whose top two bytes (encoder: lo, hi planes) or symbol (decoder: hi NULL)
 * escape. */
size_t ckz_ctx_count_escapes(const uint8_t *lo, const uint8_t *hi, size_t n);

#if CKZ_DISPATCH
/* Byte shuffles that move the escapes of 8 elements between their lanes and the escape planes
 * (filled once by ckz_ctx_init).  For an 8-bit mask of the lanes that escape, with e_j lane j's
 * 16-bit escape value and r_j its rank among the escaping lanes:
 *   ckz_ctx_esc_pack[mask]:   8 words e_j (16 bytes) -> bytes r_j = e_j's low byte, 8 + r_j =
 *                             its high byte, in lane order (the next low and high bytes of the
 *                             planes);
 *   ckz_ctx_esc_unpack[mask]: the next 8 low bytes | the next 8 high bytes -> word j = e_j, 0 in
 *                             the lanes that do not escape. */
extern uint8_t ckz_ctx_esc_pack[256][16], ckz_ctx_esc_unpack[256][16];
#endif

/* A context stream's header, as the decoder parsed it (ctx_decode.c). */
typedef struct {
    unsigned format;
    uint64_t n;          /* elements */
    unsigned elem_size;
    uint64_t buckets;
    const uint8_t *body; /* first segment or plane */
} ctx_header;

/* The error of a stored bucket count that is not the one the context gives. */
int ckz_ctx_bucket_mismatch(uint64_t stored, unsigned computed, ckz_err *err);

/* Format 2 (ctx_format2.c, decoded only): the n elements of the stream [h->body, end) into dst,
 * given the context ctx[0..n).  Retiring format 2 is deleting that file and this call. */
int ckz_ctx_decode_format2(const ctx_header *h, const uint8_t *end, const uint8_t *ctx, size_t n,
                           uint8_t *dst, unsigned elem_size, unsigned rotate, ckz_err *err);

#endif /* CKZ_CTX_INTERNAL_H */
