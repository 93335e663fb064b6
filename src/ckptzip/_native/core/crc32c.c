/* crc32c.c - CRC-32C, hardware (x86 SSE4.2, CKZ_LEVEL_V2) or slicing-by-8.
 *
 * Both paths work on the inverted register (crc ^ 0xFFFFFFFF) so that the public value chains.
 * The hardware path runs three independent crc32 chains over adjacent blocks of BLOCK bytes (the
 * instruction has latency 3 and throughput 1) and joins them with the linear "shift by BLOCK
 * bytes" operator, precomputed as four 256-entry tables (Mark Adler's crc32c.c method).  Where the
 * CPU has VPCLMULQDQ (AVX-512, CKZ_LEVEL_VBMI2), long buffers are folded 256 bytes at a time with
 * carry-less multiplies instead (crc_fold below), about twice the crc32 instruction's 8 bytes
 * per cycle.  The level is common.h's, so CKZ_CPU caps this file's pick as every other's.
 */
#include "crc32c.h"

#include "common.h"

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */
#define BLOCK 4096       /* bytes per chain in the 3-way loop; a multiple of 8 */

static uint32_t slice_tab[8][256];   /* slice_tab[k][b]: CRC of byte b followed by k zero bytes */
static uint32_t (*impl)(uint32_t, const uint8_t *, size_t);

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    for (; n && ((uintptr_t)p & 7); n--) crc = slice_tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w = ckz_load64(p) ^ crc;
        crc = slice_tab[7][w & 0xff] ^ slice_tab[6][(w >> 8) & 0xff] ^
              slice_tab[5][(w >> 16) & 0xff] ^ slice_tab[4][(w >> 24) & 0xff] ^
              slice_tab[3][(w >> 32) & 0xff] ^ slice_tab[2][(w >> 40) & 0xff] ^
              slice_tab[1][(w >> 48) & 0xff] ^ slice_tab[0][w >> 56];
    }
    for (; n; n--) crc = slice_tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if CKZ_DISPATCH
#include <immintrin.h>
#include <nmmintrin.h>

static uint32_t shift_tab[4][256]; /* shift_tab: appends BLOCK zero bytes to a CRC register */

/* Multiplication of polynomials mod POLY (reflected): the CRC-register image of a*b. */
static uint32_t gf2_mul(uint32_t a, uint32_t b) {
    uint32_t prod = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) prod ^= b;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return prod;
}

/* x^(8*nbytes) mod POLY, as a register: the operator "append nbytes zero bytes". */
static uint32_t x8n(size_t nbytes) {
    uint32_t result = 1u << 31, sq = 1u << 23; /* x^0, and x^8 */
    for (; nbytes; nbytes >>= 1, sq = gf2_mul(sq, sq))
        if (nbytes & 1) result = gf2_mul(sq, result);
    return result;
}

static uint32_t shift_block(uint32_t crc) {
    return shift_tab[0][crc & 0xff] ^ shift_tab[1][(crc >> 8) & 0xff] ^
           shift_tab[2][(crc >> 16) & 0xff] ^ shift_tab[3][crc >> 24];
}

/* x^n mod POLY, as a register (bit 31 is x^0, bit 0 is x^31). */
static uint32_t xn(uint64_t n) {
    uint32_t result = 1u << 31, power = 1u << 30; /* x^0, and x^1 */
    for (; n; n >>= 1, power = gf2_mul(power, power))
        if (n & 1) result = gf2_mul(power, result);
    return result;
}

CKZ_TARGET_V2 static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    for (; n && ((uintptr_t)p & 7); n--) crc = _mm_crc32_u8(crc, *p++);
    uint64_t c0 = crc;
    /* Three chains over p[0,B), p[B,2B), p[2B,3B); then crc(a||b) = shift(crc(a)) ^ crc'(b)
     * where crc' starts from zero: CRC is linear over GF(2). */
    for (; n >= 3 * BLOCK; n -= 3 * BLOCK, p += 3 * BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < BLOCK; i += 8) {
            c0 = _mm_crc32_u64(c0, ckz_load64(p + i));
            c1 = _mm_crc32_u64(c1, ckz_load64(p + BLOCK + i));
            c2 = _mm_crc32_u64(c2, ckz_load64(p + 2 * BLOCK + i));
        }
        c0 = shift_block((uint32_t)c0) ^ c1;
        c0 = shift_block((uint32_t)c0) ^ c2;
    }
    for (; n >= 8; n -= 8, p += 8) c0 = _mm_crc32_u64(c0, ckz_load64(p));
    crc = (uint32_t)c0;
    for (; n; n--) crc = _mm_crc32_u8(crc, *p++);
    return crc;
}

/* Folding.  Read a 16-byte block as a polynomial of degree < 128, its first bit (bit 0 of byte 0)
 * the highest term, as a reflected CRC reads bits.  Moving an accumulator A = Ah x^64 + Al (Ah:
 * bytes 0-7) forward by D bits onto a later block is A x^D = Ah x^(64+D) + Al x^D, and mod POLY
 * that is Ah * (x^(64+D) mod P) + Al * (x^D mod P): two 64x32-bit carry-less products, each of
 * degree < 96, so the fold of A is again a 16-byte block (XORed into the later one).  pclmul
 * multiplies the bit-reversed forms, whose product lands 33 bits off (the constants' registers
 * hold x^0 at bit 31, the blocks x^0 at bit 127): the constants are x^(D+31) and x^(D-33)
 * instead of x^(D+64) and x^D.  At the end the crc32 instruction over the last block, from a
 * zero register, is the block times x^32 mod P: the CRC register of everything folded in. */
#define FOLD_BYTES 256 /* per loop iteration: four 64-byte accumulators */
static uint64_t fold_k[4][2]; /* {x^(D+31), x^(D-33)} mod P for D = 2048, 512, 128 bits; 384 */

static void fold_init(void) {
    static const unsigned bits[4] = {FOLD_BYTES * 8, 512, 128, 384};
    for (int i = 0; i < 4; i++) {
        fold_k[i][0] = xn(bits[i] + 31);
        fold_k[i][1] = xn(bits[i] - 33);
    }
}

CKZ_INLINE_VBMI2 __m512i fold512(__m512i acc, __m512i k, __m512i next) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00),
                                     _mm512_clmulepi64_epi128(acc, k, 0x11), next, 0x96);
}

CKZ_INLINE_VBMI2 __m128i fold128(__m128i acc, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x00),
                                       _mm_clmulepi64_si128(acc, k, 0x11)), next);
}

CKZ_TARGET_VBMI2 static uint32_t crc_fold(uint32_t crc, const uint8_t *p, size_t n) {
    if (n < 2 * FOLD_BYTES) return crc_hw(crc, p, n);
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_loadu_si128((const void *)fold_k[0]));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_loadu_si128((const void *)fold_k[1]));
    /* the register so far goes into the first 4 bytes: crc(M) continues as crc(M ^ reg) from 0 */
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p),
                                  _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128),
            x3 = _mm512_loadu_si512(p + 192);
    for (p += FOLD_BYTES, n -= FOLD_BYTES; n >= FOLD_BYTES; p += FOLD_BYTES, n -= FOLD_BYTES) {
        x0 = fold512(x0, k2048, _mm512_loadu_si512(p));
        x1 = fold512(x1, k2048, _mm512_loadu_si512(p + 64));
        x2 = fold512(x2, k2048, _mm512_loadu_si512(p + 128));
        x3 = fold512(x3, k2048, _mm512_loadu_si512(p + 192));
    }
    x1 = fold512(x0, k512, x1); /* the four accumulators into one, 64 bytes apart */
    x2 = fold512(x1, k512, x2);
    x3 = fold512(x2, k512, x3);
    for (; n >= 64; p += 64, n -= 64) x3 = fold512(x3, k512, _mm512_loadu_si512(p));
    /* its four 16-byte lanes into the last one: 48, 32 and 16 bytes ahead */
    const __m128i k128 = _mm_loadu_si128((const void *)fold_k[2]);
    const __m128i k384 = _mm_loadu_si128((const void *)fold_k[3]);
    __m128i a = fold128(_mm512_extracti32x4_epi32(x3, 0), k384, _mm512_extracti32x4_epi32(x3, 3));
    __m128i b = fold128(_mm512_extracti32x4_epi32(x3, 1), k128, _mm512_extracti32x4_epi32(x3, 2));
    a = fold128(b, k128, a); /* (lane1 x^128 + lane2) x^128 + a */
    /* a = lane0 x^384 + lane1 x^256 + lane2 x^128 + lane3 (mod P), the last as it stands */
    for (; n >= 16; p += 16, n -= 16) a = fold128(a, k128, _mm_loadu_si128((const void *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(a));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(a, 1));
    return crc_hw((uint32_t)c, p, n);
}
#endif

void ckz_crc32c_init(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        slice_tab[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (uint32_t b = 0; b < 256; b++)
            slice_tab[k][b] = (slice_tab[k - 1][b] >> 8) ^ slice_tab[0][slice_tab[k - 1][b] & 0xff];
    impl = crc_sw;
#if CKZ_DISPATCH
    uint32_t op = x8n(BLOCK);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) shift_tab[k][b] = gf2_mul(op, b << (8 * k));
    fold_init();
    if (CKZ_CPU_AT(V2)) impl = crc_hw;
    if (CKZ_CPU_AT(VBMI2)) impl = crc_fold;
#endif
}

uint32_t ckz_crc32c(uint32_t crc, const uint8_t *data, size_t n) {
    return ~impl(~crc, data, n);
}
