/* planes.c - byte-plane split/merge (see planes.h for the layout).
 *
 * The loops for 1, 2, 4 and 8 byte elements are plain C over byte loads and stores, written so
 * that GCC and Clang vectorize them (shift, or, pack/unpack); CKZ_VERSIONED builds them for AVX2
 * and for the baseline and picks one at run time.  Other sizes take the generic byte loop.
 */
#include "planes.h"

#include "common.h"

/* Rotations written so that rotate == 0 never shifts by the full width (undefined in C). */
#define ROTL(type, bits, x, r) ((type)(((x) << (r)) | ((x) >> ((bits - (r)) & (bits - 1)))))
#define ROTR(type, bits, x, r) ((type)(((x) >> (r)) | ((x) << ((bits - (r)) & (bits - 1)))))

CKZ_INLINE void split1_impl(const uint8_t *restrict src, uint8_t *restrict dst, size_t n,
                            unsigned r) {
    for (size_t i = 0; i < n; i++) dst[i] = ROTL(uint8_t, 8, src[i], r);
}
CKZ_VERSIONED(split1, (const uint8_t *restrict src, uint8_t *restrict dst, size_t n, unsigned r),
              (src, dst, n, r))

CKZ_INLINE void merge1_impl(const uint8_t *restrict p0, uint8_t *restrict dst, size_t n,
                            unsigned r) {
    for (size_t i = 0; i < n; i++) dst[i] = ROTR(uint8_t, 8, p0[i], r);
}
CKZ_VERSIONED(merge1, (const uint8_t *restrict p0, uint8_t *restrict dst, size_t n, unsigned r),
              (p0, dst, n, r))

CKZ_INLINE void split2_impl(const uint8_t *restrict src, uint8_t *restrict p0,
                            uint8_t *restrict p1, size_t n, unsigned r) {
    for (size_t i = 0; i < n; i++) {
        uint16_t w = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
        w = ROTL(uint16_t, 16, w, r);
        p0[i] = (uint8_t)w;
        p1[i] = (uint8_t)(w >> 8);
    }
}
CKZ_VERSIONED(split2, (const uint8_t *restrict src, uint8_t *restrict p0, uint8_t *restrict p1,
                       size_t n, unsigned r),
              (src, p0, p1, n, r))

CKZ_INLINE void merge2_impl(const uint8_t *restrict p0, const uint8_t *restrict p1,
                            uint8_t *restrict dst, size_t n, unsigned r) {
    for (size_t i = 0; i < n; i++) {
        uint16_t w = (uint16_t)(p0[i] | (p1[i] << 8));
        w = ROTR(uint16_t, 16, w, r);
        dst[2 * i] = (uint8_t)w;
        dst[2 * i + 1] = (uint8_t)(w >> 8);
    }
}
CKZ_VERSIONED(merge2, (const uint8_t *restrict p0, const uint8_t *restrict p1,
                       uint8_t *restrict dst, size_t n, unsigned r),
              (p0, p1, dst, n, r))

CKZ_INLINE void split4_impl(const uint8_t *restrict src, uint8_t *restrict p0,
                            uint8_t *restrict p1, uint8_t *restrict p2, uint8_t *restrict p3,
                            size_t n, unsigned r) {
    for (size_t i = 0; i < n; i++) {
        uint32_t w = (uint32_t)src[4 * i] | ((uint32_t)src[4 * i + 1] << 8) |
                     ((uint32_t)src[4 * i + 2] << 16) | ((uint32_t)src[4 * i + 3] << 24);
        w = ROTL(uint32_t, 32, w, r);
        p0[i] = (uint8_t)w;
        p1[i] = (uint8_t)(w >> 8);
        p2[i] = (uint8_t)(w >> 16);
        p3[i] = (uint8_t)(w >> 24);
    }
}
CKZ_VERSIONED(split4, (const uint8_t *restrict src, uint8_t *restrict p0, uint8_t *restrict p1,
                       uint8_t *restrict p2, uint8_t *restrict p3, size_t n, unsigned r),
              (src, p0, p1, p2, p3, n, r))

CKZ_INLINE void merge4_impl(const uint8_t *restrict p0, const uint8_t *restrict p1,
                            const uint8_t *restrict p2, const uint8_t *restrict p3,
                            uint8_t *restrict dst, size_t n, unsigned r) {
    for (size_t i = 0; i < n; i++) {
        uint32_t w = (uint32_t)p0[i] | ((uint32_t)p1[i] << 8) | ((uint32_t)p2[i] << 16) |
                     ((uint32_t)p3[i] << 24);
        w = ROTR(uint32_t, 32, w, r);
        dst[4 * i] = (uint8_t)w;
        dst[4 * i + 1] = (uint8_t)(w >> 8);
        dst[4 * i + 2] = (uint8_t)(w >> 16);
        dst[4 * i + 3] = (uint8_t)(w >> 24);
    }
}
CKZ_VERSIONED(merge4, (const uint8_t *restrict p0, const uint8_t *restrict p1,
                       const uint8_t *restrict p2, const uint8_t *restrict p3,
                       uint8_t *restrict dst, size_t n, unsigned r),
              (p0, p1, p2, p3, dst, n, r))

CKZ_INLINE void split8_impl(const uint8_t *restrict src, uint8_t *restrict dst, size_t n,
                            unsigned r) {
    for (size_t i = 0; i < n; i++) {
        uint64_t w = ckz_load64(src + 8 * i);
        w = ROTL(uint64_t, 64, w, r);
        for (unsigned p = 0; p < 8; p++) dst[p * n + i] = (uint8_t)(w >> (8 * p));
    }
}
CKZ_VERSIONED(split8, (const uint8_t *restrict src, uint8_t *restrict dst, size_t n, unsigned r),
              (src, dst, n, r))

CKZ_INLINE void merge8_impl(const uint8_t *const *planes, uint8_t *restrict dst, size_t n,
                            unsigned r) {
    for (size_t i = 0; i < n; i++) {
        uint64_t w = 0;
        for (unsigned p = 0; p < 8; p++) w |= (uint64_t)planes[p][i] << (8 * p);
        ckz_store64(dst + 8 * i, ROTR(uint64_t, 64, w, r));
    }
}
CKZ_VERSIONED(merge8, (const uint8_t *const *planes, uint8_t *restrict dst, size_t n, unsigned r),
              (planes, dst, n, r))

#if CKZ_DISPATCH
#include <immintrin.h>

/* 4-byte elements by hand: compilers vectorize the 4-plane transpose poorly (~5 GB/s against
 * ~10 for 2 planes).  Each loop handles 32 elements per step and returns how many it did; the
 * portable loop finishes the tail. */
CKZ_TARGET_V3 static size_t split4_avx2(const uint8_t *src, uint8_t *p0,
                                        uint8_t *p1, uint8_t *p2, uint8_t *p3,
                                        size_t n, unsigned r) {
    const __m128i cl = _mm_cvtsi32_si128((int)r), cr = _mm_cvtsi32_si128((int)((32 - r) & 31));
    /* per 128-bit lane: bytes 0 of its 4 elements, then bytes 1, 2, 3 */
    const __m256i gather = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i v[4];
        for (int j = 0; j < 4; j++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(src + 4 * i + 32 * j));
            a = _mm256_or_si256(_mm256_sll_epi32(a, cl), _mm256_srl_epi32(a, cr)); /* rotl r */
            v[j] = _mm256_shuffle_epi8(a, gather);
        }
        /* 4x4 transpose of 32-bit groups within lanes, then restore element order across
         * lanes: plane p's dwords come out as (v0.lo, v1.lo, v2.lo, v3.lo, v0.hi, ...). */
        __m256i ab_lo = _mm256_unpacklo_epi32(v[0], v[1]);
        __m256i ab_hi = _mm256_unpackhi_epi32(v[0], v[1]);
        __m256i cd_lo = _mm256_unpacklo_epi32(v[2], v[3]);
        __m256i cd_hi = _mm256_unpackhi_epi32(v[2], v[3]);
        __m256i q[4] = {_mm256_unpacklo_epi64(ab_lo, cd_lo), _mm256_unpackhi_epi64(ab_lo, cd_lo),
                        _mm256_unpacklo_epi64(ab_hi, cd_hi), _mm256_unpackhi_epi64(ab_hi, cd_hi)};
        uint8_t *dst[4] = {p0, p1, p2, p3};
        for (int j = 0; j < 4; j++)
            _mm256_storeu_si256((__m256i *)(dst[j] + i),
                                _mm256_permutevar8x32_epi32(q[j], order));
    }
    return i;
}

CKZ_TARGET_V3 static size_t merge4_avx2(const uint8_t *p0, const uint8_t *p1,
                                        const uint8_t *p2, const uint8_t *p3,
                                        uint8_t *dst, size_t n, unsigned r) {
    const __m128i cr = _mm_cvtsi32_si128((int)r), cl = _mm_cvtsi32_si128((int)((32 - r) & 31));
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p0 + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(p1 + i));
        __m256i c = _mm256_loadu_si256((const __m256i *)(p2 + i));
        __m256i d = _mm256_loadu_si256((const __m256i *)(p3 + i));
        /* Interleave within lanes: ab0 holds elements 0-7 | 16-23, ab1 8-15 | 24-31. */
        __m256i ab0 = _mm256_unpacklo_epi8(a, b), ab1 = _mm256_unpackhi_epi8(a, b);
        __m256i cd0 = _mm256_unpacklo_epi8(c, d), cd1 = _mm256_unpackhi_epi8(c, d);
        /* Whole elements: w0 = 0-3 | 16-19, w1 = 4-7 | 20-23, w2 = 8-11 | 24-27,
         * w3 = 12-15 | 28-31. */
        __m256i w0 = _mm256_unpacklo_epi16(ab0, cd0), w1 = _mm256_unpackhi_epi16(ab0, cd0);
        __m256i w2 = _mm256_unpacklo_epi16(ab1, cd1), w3 = _mm256_unpackhi_epi16(ab1, cd1);
        __m256i o[4] = {_mm256_permute2x128_si256(w0, w1, 0x20),
                        _mm256_permute2x128_si256(w2, w3, 0x20),
                        _mm256_permute2x128_si256(w0, w1, 0x31),
                        _mm256_permute2x128_si256(w2, w3, 0x31)};
        for (int j = 0; j < 4; j++) {
            __m256i x = _mm256_or_si256(_mm256_srl_epi32(o[j], cr), _mm256_sll_epi32(o[j], cl));
            _mm256_storeu_si256((__m256i *)(dst + 4 * i + 32 * j), x); /* rotr r */
        }
    }
    return i;
}
#endif

#if CKZ_DISPATCH
/* AVX-512 VBMI: a byte permute across two 64-byte vectors (vpermt2b) is a whole plane step.
 * 2-byte elements: 64 per step, two loads, two permutes, two full stores; 4-byte elements: 64
 * per step, four loads, transposed by two rounds of two-source permutes.  The rotations are
 * shift pairs (16-bit shifts by 16 give zero, so r = 0 needs no case). */

CKZ_TARGET_V4 static __m512i bytes_every(unsigned stride, unsigned first) {
    uint8_t idx[64];
    for (unsigned j = 0; j < 64; j++) idx[j] = (uint8_t)((first + stride * j) & 127);
    return _mm512_loadu_si512(idx);
}

CKZ_TARGET_V4 static size_t split2_v4(const uint8_t *src, uint8_t *p0, uint8_t *p1, size_t n,
                                      unsigned r) {
    const __m128i cl = _mm_cvtsi32_si128((int)r), cr = _mm_cvtsi32_si128((int)(16 - r));
    const __m512i even = bytes_every(2, 0), odd = bytes_every(2, 1);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i a = _mm512_loadu_si512(src + 2 * i), b = _mm512_loadu_si512(src + 2 * i + 64);
        a = _mm512_or_si512(_mm512_sll_epi16(a, cl), _mm512_srl_epi16(a, cr));
        b = _mm512_or_si512(_mm512_sll_epi16(b, cl), _mm512_srl_epi16(b, cr));
        _mm512_storeu_si512(p0 + i, _mm512_permutex2var_epi8(a, even, b));
        _mm512_storeu_si512(p1 + i, _mm512_permutex2var_epi8(a, odd, b));
    }
    return i;
}

CKZ_TARGET_V4 static size_t merge2_v4(const uint8_t *p0, const uint8_t *p1, uint8_t *dst, size_t n,
                                      unsigned r) {
    const __m128i cr = _mm_cvtsi32_si128((int)r), cl = _mm_cvtsi32_si128((int)(16 - r));
    uint8_t lo[64], hi[64]; /* byte j of the output: plane j % 2, element j / 2 (+ 32 for hi) */
    for (unsigned j = 0; j < 64; j++) {
        lo[j] = (uint8_t)((j & 1) * 64 + j / 2);
        hi[j] = (uint8_t)((j & 1) * 64 + 32 + j / 2);
    }
    const __m512i ilo = _mm512_loadu_si512(lo), ihi = _mm512_loadu_si512(hi);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i a = _mm512_loadu_si512(p0 + i), b = _mm512_loadu_si512(p1 + i);
        __m512i x = _mm512_permutex2var_epi8(a, ilo, b), y = _mm512_permutex2var_epi8(a, ihi, b);
        x = _mm512_or_si512(_mm512_srl_epi16(x, cr), _mm512_sll_epi16(x, cl));
        y = _mm512_or_si512(_mm512_srl_epi16(y, cr), _mm512_sll_epi16(y, cl));
        _mm512_storeu_si512(dst + 2 * i, x);
        _mm512_storeu_si512(dst + 2 * i + 64, y);
    }
    return i;
}

/* idx[j] = 4 (j mod 32) + b: from a pair of vectors (32 elements), byte b of each, twice over. */
CKZ_TARGET_V4 static __m512i plane_of_pair(unsigned b) {
    uint8_t idx[64];
    for (unsigned j = 0; j < 64; j++) idx[j] = (uint8_t)(4 * (j % 32) + b);
    return _mm512_loadu_si512(idx);
}

CKZ_TARGET_V4 static size_t split4_v4(const uint8_t *src, uint8_t *p0, uint8_t *p1, uint8_t *p2,
                                      uint8_t *p3, size_t n, unsigned r) {
    const __m128i cl = _mm_cvtsi32_si128((int)r), cr = _mm_cvtsi32_si128((int)(32 - r));
    const __m512i idx[4] = {plane_of_pair(0), plane_of_pair(1), plane_of_pair(2),
                            plane_of_pair(3)};
    uint8_t *dst[4] = {p0, p1, p2, p3};
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i v[4];
        for (int j = 0; j < 4; j++) {
            __m512i a = _mm512_loadu_si512(src + 4 * i + 64 * j);
            v[j] = _mm512_or_si512(_mm512_sll_epi32(a, cl), _mm512_srl_epi32(a, cr));
        }
        /* plane b: elements 0-31 from (v0, v1) in the low half, 32-63 from (v2, v3) above */
        for (int b = 0; b < 4; b++) {
            __m512i first = _mm512_permutex2var_epi8(v[0], idx[b], v[1]);
            __m512i second = _mm512_permutex2var_epi8(v[2], idx[b], v[3]);
            _mm512_storeu_si512(dst[b] + i, _mm512_mask_blend_epi64(0xF0, first, second));
        }
    }
    return i;
}

CKZ_TARGET_V4 static size_t merge4_v4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                                      const uint8_t *p3, uint8_t *dst, size_t n, unsigned r) {
    const __m128i cr = _mm_cvtsi32_si128((int)r), cl = _mm_cvtsi32_si128((int)(32 - r));
    /* stage 1: two planes interleaved, elements 0-31 (lo) or 32-63 (hi) */
    uint8_t pair_lo[64], pair_hi[64], out[4][64];
    for (unsigned j = 0; j < 64; j++) {
        pair_lo[j] = (uint8_t)((j & 1) * 64 + j / 2);
        pair_hi[j] = (uint8_t)((j & 1) * 64 + 32 + j / 2);
    }
    /* stage 2: output vector k (elements 16k..16k+15) from the interleaved pairs: byte 4e + b is
     * byte 2e' + b of (P0P1) for b < 2, of (P2P3) for b >= 2, e' = e + 16 (k mod 2) */
    for (unsigned k = 0; k < 4; k++)
        for (unsigned j = 0; j < 64; j++) {
            unsigned e = j / 4 + 16 * (k % 2), b = j % 4;
            out[k][j] = (uint8_t)((b >= 2) * 64 + 2 * e + (b & 1));
        }
    const __m512i ilo = _mm512_loadu_si512(pair_lo), ihi = _mm512_loadu_si512(pair_hi);
    const __m512i o0 = _mm512_loadu_si512(out[0]), o1 = _mm512_loadu_si512(out[1]);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i a = _mm512_loadu_si512(p0 + i), b = _mm512_loadu_si512(p1 + i);
        __m512i c = _mm512_loadu_si512(p2 + i), d = _mm512_loadu_si512(p3 + i);
        __m512i ab_lo = _mm512_permutex2var_epi8(a, ilo, b);
        __m512i ab_hi = _mm512_permutex2var_epi8(a, ihi, b);
        __m512i cd_lo = _mm512_permutex2var_epi8(c, ilo, d);
        __m512i cd_hi = _mm512_permutex2var_epi8(c, ihi, d);
        __m512i w[4] = {_mm512_permutex2var_epi8(ab_lo, o0, cd_lo),
                        _mm512_permutex2var_epi8(ab_lo, o1, cd_lo),
                        _mm512_permutex2var_epi8(ab_hi, o0, cd_hi),
                        _mm512_permutex2var_epi8(ab_hi, o1, cd_hi)};
        for (int k = 0; k < 4; k++) {
            __m512i rotated =
                _mm512_or_si512(_mm512_srl_epi32(w[k], cr), _mm512_sll_epi32(w[k], cl));
            _mm512_storeu_si512(dst + 4 * i + 64 * k, rotated);
        }
    }
    return i;
}

#endif

/* Generic element size k: a left rotation by r = 8*q + b bits moves source byte j to byte
 * (j + q) mod k, shifted left by b, with the spill of byte j-1 filling its low bits:
 *     out[t] = (in[(t - q) mod k] << b) | (in[(t - q - 1) mod k] >> (8 - b))   (b > 0). */
static void split_generic(const uint8_t *src, uint8_t *dst, size_t n, unsigned k, unsigned r) {
    unsigned q = r / 8, b = r % 8;
    for (unsigned t = 0; t < k; t++) {
        unsigned hi = (t + k - q) % k, lo = (t + 2 * k - q - 1) % k;
        uint8_t *out = dst + (size_t)t * n;
        for (size_t i = 0; i < n; i++) {
            const uint8_t *e = src + i * k;
            out[i] = b ? (uint8_t)((e[hi] << b) | (e[lo] >> (8 - b))) : e[hi];
        }
    }
}

/* Inverse: rotate right by r, i.e. left by 8k - r. */
static void merge_generic(const uint8_t *const *planes, uint8_t *dst, size_t n, unsigned k,
                          unsigned r) {
    unsigned l = (8 * k - r) % (8 * k), q = l / 8, b = l % 8;
    for (unsigned t = 0; t < k; t++) {
        const uint8_t *hi = planes[(t + k - q) % k], *lo = planes[(t + 2 * k - q - 1) % k];
        for (size_t i = 0; i < n; i++)
            dst[i * k + t] = b ? (uint8_t)((hi[i] << b) | (lo[i] >> (8 - b))) : hi[i];
    }
}

void ckz_split_planes(const uint8_t *src, uint8_t *dst, size_t n, unsigned elem_size,
                      unsigned rotate) {
    switch (elem_size) {
    case 1: split1(src, dst, n, rotate); break;
    case 2: {
        size_t done = 0;
#if CKZ_DISPATCH
        if (CKZ_CPU_AT(V4)) done = split2_v4(src, dst, dst + n, n, rotate);
#endif
        split2(src + 2 * done, dst + done, dst + n + done, n - done, rotate);
        break;
    }
    case 4: {
        size_t done = 0;
#if CKZ_DISPATCH
        if (CKZ_CPU_AT(V4))
            done = split4_v4(src, dst, dst + n, dst + 2 * n, dst + 3 * n, n, rotate);
        else if (CKZ_CPU_AT(V3))
            done = split4_avx2(src, dst, dst + n, dst + 2 * n, dst + 3 * n, n, rotate);
#endif
        split4(src + 4 * done, dst + done, dst + n + done, dst + 2 * n + done,
               dst + 3 * n + done, n - done, rotate);
        break;
    }
    case 8: split8(src, dst, n, rotate); break;
    default: split_generic(src, dst, n, elem_size, rotate); break;
    }
}

void ckz_merge_planes(const uint8_t *const *planes, uint8_t *dst, size_t n, unsigned elem_size,
                      unsigned rotate) {
    switch (elem_size) {
    case 1: merge1(planes[0], dst, n, rotate); break;
    case 2: {
        size_t done = 0;
#if CKZ_DISPATCH
        if (CKZ_CPU_AT(V4)) done = merge2_v4(planes[0], planes[1], dst, n, rotate);
#endif
        merge2(planes[0] + done, planes[1] + done, dst + 2 * done, n - done, rotate);
        break;
    }
    case 4: {
        size_t done = 0;
#if CKZ_DISPATCH
        if (CKZ_CPU_AT(V4))
            done = merge4_v4(planes[0], planes[1], planes[2], planes[3], dst, n, rotate);
        else if (CKZ_CPU_AT(V3))
            done = merge4_avx2(planes[0], planes[1], planes[2], planes[3], dst, n, rotate);
#endif
        merge4(planes[0] + done, planes[1] + done, planes[2] + done, planes[3] + done,
               dst + 4 * done, n - done, rotate);
        break;
    }
    case 8: merge8(planes, dst, n, rotate); break;
    default: merge_generic(planes, dst, n, elem_size, rotate); break;
    }
}
