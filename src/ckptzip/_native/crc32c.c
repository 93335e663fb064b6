/* crc32c.c - CRC-32C, hardware (x86 SSE4.2) or slicing-by-8.
 *
 * Both paths work on the inverted register (crc ^ 0xFFFFFFFF) so that the public value chains.
 * The hardware path runs three independent crc32 chains over adjacent blocks of BLOCK bytes (the
 * instruction has latency 3 and throughput 1) and joins them with the linear "shift by BLOCK
 * bytes" operator, precomputed as four 256-entry tables (Mark Adler's crc32c.c method).
 */
#include "crc32c.h"

#include "common.h"

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */
#define BLOCK 4096       /* bytes per chain in the 3-way loop; a multiple of 8 */

static uint32_t slice_tab[8][256];   /* slice_tab[k][b]: CRC of byte b followed by k zero bytes */
static uint32_t shift_tab[4][256];   /* shift_tab: appends BLOCK zero bytes to a CRC register */
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

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
                                                        size_t n) {
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
    uint32_t op = x8n(BLOCK);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) shift_tab[k][b] = gf2_mul(op, b << (8 * k));
    impl = crc_sw;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) impl = crc_hw;
#endif
}

uint32_t ckz_crc32c(uint32_t crc, const uint8_t *data, size_t n) {
    return ~impl(~crc, data, n);
}
