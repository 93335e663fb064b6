/* hist.h - byte histograms and what the encoders decide from them before coding: the per-quarter
 * byte counts (Huffman's streams, format 3's context), the (bucket, byte) counts of a context
 * plane, the noise screen, and the used range of a 256-entry table.  One copy of each, shared by
 * huff.c, rans.c, stream.c and the context coder (ctx*.c).  Depends on common.h only.
 */
#ifndef CKZ_HIST_H
#define CKZ_HIST_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* A segment of n symbols is cut into CKZ_HIST_QUARTERS quarters: quarters 0..2 hold ceil(n/4)
 * each (or what is left), quarter 3 the rest.  They are a HUFF segment's streams
 * (CKZ_HUF_STREAMS), a RANS segment's streams, and format 2's lanes. */
#define CKZ_HIST_QUARTERS 4

/* Symbols in quarter k of an n-symbol segment. */
static inline size_t ckz_quarter_count(size_t n, unsigned k) {
    size_t q = (n + CKZ_HIST_QUARTERS - 1) / CKZ_HIST_QUARTERS, start = q * k;
    if (start >= n) return 0;
    return n - start < q ? n - start : q;
}

/* First symbol of quarter k (n when the quarter is empty, so pointers stay within the data). */
static inline size_t ckz_quarter_start(size_t n, unsigned k) {
    size_t start = (n + CKZ_HIST_QUARTERS - 1) / CKZ_HIST_QUARTERS * k;
    return start < n ? start : n;
}

/* counts[k][s]: occurrences of byte s in quarter k of src[0..n).  Exponent bytes fall in a few
 * neighbouring values, where a scalar histogram spends a store-to-load chain per byte: with
 * AVX2 (CKZ_LEVEL_V3) or AVX-512 BW (V4), when an even sample of 512 bytes (n >= 4096) puts at
 * least 31/32 of them in one window of 16 consecutive values, each value of the window is
 * counted by a compare per vector, the bytes outside it one by one; otherwise by interleaved
 * scalar counters.  The counts are exact either way. */
void ckz_hist_count(const uint8_t *src, size_t n, uint32_t counts[CKZ_HIST_QUARTERS][256]);

/* h[v]: occurrences of byte v in src[0..n) (ckz_hist_count's quarters summed). */
void ckz_hist_total(const uint8_t *src, size_t n, uint32_t h[256]);

/* hist[b * 256 + v] = elements i < n with bk[i] = b and s[i] = v, for the B buckets (bk[i] < B
 * <= 32) whose element counts are size[0..B); spare holds 3 * B * 256 counters of scratch.  With
 * AVX2, when each bucket's most frequent byte in an even sample takes >= 15/16 of it (a high
 * residual plane), only the other bytes are counted one by one. */
void ckz_hist_buckets(const uint8_t *s, const uint8_t *bk, size_t n, unsigned B,
                      const size_t *size, uint32_t *hist, uint32_t *spare);

/* The noise screen: 1 when a plane or segment of m bytes is at least CKZ_SCREEN_MIN long and an
 * even sample of 8192 of its bytes has a collision entropy (unbiased estimate) of at least 7.8
 * bits per byte; it is then stored RAW without a full histogram.  Coding pays only below
 * 19/20 * 8 = 7.6 bits (stream.h's CKZ_CODED_NUM / CKZ_CODED_DEN), and the Shannon entropy is
 * >= the collision entropy.  Mantissa planes (7.97 bits) take this path; the cost of a wrong
 * call is only a plane kept RAW that coding would have shrunk (the decision is deterministic,
 * so output is still stable). */
#define CKZ_SCREEN_MIN 65536
int ckz_looks_like_noise(const uint8_t *s, size_t m);

/* The used range of a 256-entry table of entry_bytes-byte entries (code lengths, frequencies):
 * *lo the first nonzero entry, *hi the last (*lo = *hi = 255 when every entry is zero). */
void ckz_used_range(const void *table, size_t entry_bytes, unsigned *lo, unsigned *hi);

#endif /* CKZ_HIST_H */
