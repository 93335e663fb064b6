/* rans.h - static rANS (32-bit states, 16-bit renormalization) for segments where Huffman's
 * whole-bit codes waste too much: low-entropy planes whose top symbol has probability near or
 * above 1/2.  Frequencies are normalized to sum 2^CKZ_RANS_PROB_BITS.
 *
 * Two layouts.  RANS (segment mode 3, written for small segments) has the stream layout of a
 * HUFF segment (huff.h): a segment's n symbols are cut into CKZ_HIST_QUARTERS quarters
 * (ckz_quarter_count, hist.h), quarter k coded into its own stream, 16 bytes of states in all.
 * RANS32 (mode 4, the larger segments) interleaves CKZ_RANS32_LANES states in one stream, for a
 * vectorized decoder, at 128 bytes of states.
 */
#ifndef CKZ_RANS_H
#define CKZ_RANS_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "hist.h"

#define CKZ_RANS_PROB_BITS 12
#define CKZ_RANS_PROB_SCALE (1u << CKZ_RANS_PROB_BITS)
#define CKZ_RANS_L (1u << 16) /* state lower bound; states live in [L, 2^32), renormalized by
                                 16-bit little-endian words */

/* freq[s] > 0 for every symbol with total[s] > 0, summing to CKZ_RANS_PROB_SCALE.  Needs at
 * least two used symbols. */
void ckz_rans_normalize(const uint64_t total[256], uint64_t n, uint16_t freq[256]);
/* The same normalized to sum 2^bits (8 <= bits <= CKZ_RANS_PROB_BITS). */
void ckz_rans_normalize_bits(const uint64_t total[256], uint64_t n, unsigned bits,
                             uint16_t freq[256]);

/* Decode table of a frequency table summing to CKZ_RANS_PROB_SCALE: slot -> symbol |
 * (slot - c) << 8 | f << 20 (f, slot - c < 2^12). */
void ckz_rans_build_dtable(const uint16_t freq[256], uint32_t T[CKZ_RANS_PROB_SCALE]);
/* The same for frequencies that are all multiples of 2^shift: SCALE >> shift entries, entry j
 * covering slots j 2^shift .. (j + 1) 2^shift - 1 (its slot - c holds the first one's). */
void ckz_rans_build_dtable_unit(const uint16_t freq[256], unsigned shift, uint32_t *T);

/* Serialized table: byte `first`, byte `count - 1`, then a LEB128 frequency per symbol of
 * first..first+count-1 (0 = unused).  Size, writer, validating reader (sets *used_bytes and
 * returns 0, or returns -1; checks every frequency, the range and the exact sum). */
size_t ckz_rans_table_size(const uint16_t freq[256]);
size_t ckz_rans_write_table(const uint16_t freq[256], uint8_t *out);
int ckz_rans_read_table(const uint8_t *in, size_t avail, uint16_t freq[256], size_t *used_bytes,
                        ckz_err *err);

/* Decodes the streams into out[0..n).  Fails unless each stream is consumed exactly and every
 * state returns to its initial value. */
int ckz_rans_decode(const uint16_t freq[256], const uint8_t *const in[CKZ_HIST_QUARTERS],
                    const size_t size[CKZ_HIST_QUARTERS], uint8_t *out, size_t n, ckz_err *err);

/* Scratch for ckz_rans_encode of n symbols: each quarter's state and at most one word per symbol
 * (no more than ckz_rans32_scratch_size(n), so a RANS32 scratch serves both). */
static inline size_t ckz_rans_scratch_size(size_t n) { return 4 * CKZ_HIST_QUARTERS + 2 * n; }

/* Codes src[0..n) with the normalized frequencies freq as a RANS segment's four quarter streams,
 * written backwards into the end of scratch (ckz_rans_scratch_size(n) bytes): stream k is
 * size[k] bytes at start[k], and the four lie back to back (start[k + 1] == start[k] + size[k]).
 * Written for small segments, where RANS32's 128 bytes of states outweigh its decode speed. */
void ckz_rans_encode(const uint8_t *src, size_t n, const uint16_t freq[256], uint8_t *scratch,
                     const uint8_t *start[CKZ_HIST_QUARTERS], size_t size[CKZ_HIST_QUARTERS]);

/* ---- 32-lane interleaved rANS (segment mode RANS32) ----------------------------------------
 * Same states, renormalization and table as above, but CKZ_RANS32_LANES states share one word
 * stream: symbol i belongs to lane i % CKZ_RANS32_LANES, symbols are decoded in index order, and
 * each refill takes the next 16-bit word, so 8 consecutive symbols are one AVX2 step (gather,
 * 32-bit multiply, refill by a pdep-computed permutation).  Stream: the lanes' u32 initial
 * states, lane 0 first, then the words; decoding must use every byte and leave every state at L.
 */
#define CKZ_RANS32_LANES 32

/* Fills the constant tables (the decoder's refill permutations, ckz_rans_log2); call once before
 * any other function here (module init). */
void ckz_rans_init(void);
/* ckz_rans_log2[f] = log2(f) for 1 <= f <= CKZ_RANS_PROB_SCALE: exact code lengths for the
 * encoders' size accounting. */
extern float ckz_rans_log2[CKZ_RANS_PROB_SCALE + 1];
#define CKZ_RANS32_STATE_BYTES (4 * CKZ_RANS32_LANES)

/* Worst-case scratch for n symbols: two bytes per symbol (one word at most), the states, and
 * the 16 bytes the branch-free flushes may store below the stream (a vector step stores 8
 * words at once). */
static inline size_t ckz_rans32_scratch_size(size_t n) {
    return 2 * n + CKZ_RANS32_STATE_BYTES + 16;
}

/* Codes src[0..n) into the end of scratch (ckz_rans32_scratch_size(n) bytes); the stream is
 * *start[0..*size).  Every symbol of src must have freq > 0. */
void ckz_rans32_encode(const uint8_t *src, size_t n, const uint16_t freq[256], uint8_t *scratch,
                       const uint8_t **start, size_t *size);

/* Decodes a stream of len bytes into out[0..n).  Fails unless every byte is used and every state
 * ends at L. */
int ckz_rans32_decode(const uint16_t freq[256], const uint8_t *in, size_t len, uint8_t *out,
                      size_t n, ckz_err *err);

/* ---- bucketed RANS32 (context stream format 3) --------------------------------------------
 * The RANS32 stream above, but symbol i is coded with table tab[i] (< tables) of a set of
 * tables: states, renormalization, word order and stream end are unchanged, only the slot lookup
 * becomes T[tab[i] * SCALE + slot] and the encoder's (f, c) come from table tab[i]. */

/* Codes src[0..n) into the end of scratch (ckz_rans32_scratch_size(n) bytes) with tables
 * freq[0..tables); every symbol must have freq[tab[i]][src[i]] > 0.  Returns -1 only when its
 * (tables * 3 KiB) workspace cannot be allocated. */
int ckz_rans32_encode_tab(const uint8_t *src, const uint8_t *tab, size_t n,
                          const uint16_t (*freq)[256], unsigned tables, uint8_t *scratch,
                          const uint8_t **start, size_t *size);

/* Decodes with the decode tables T (ckz_rans_build_dtable_unit(..., shift, ...) each, table t at
 * T + t * (SCALE >> shift)); the caller guarantees tab[i] indexes one of them.  Same checks as
 * ckz_rans32_decode. */
int ckz_rans32_decode_tab(const uint32_t *T, const uint8_t *tab, unsigned shift,
                          const uint8_t *in, size_t len, uint8_t *out, size_t n, ckz_err *err);

/* Two such streams of n symbols each with the same table indices tab (two planes of a chunk),
 * stream k with tables T[k] of unit 2^shift[k]: the same outcome, bytes and first error as
 * decoding stream 0 and then stream 1 with ckz_rans32_decode_tab, in one loop while both have
 * words in hand (twice the independent state chains).  tab NULL: one table T[k] each (shift 0;
 * the same plane of two chunks). */
int ckz_rans32_decode_tab2(const uint32_t *const T[2], const uint8_t *tab,
                           const unsigned shift[2], const uint8_t *const in[2],
                           const size_t len[2], uint8_t *const out[2], size_t n, ckz_err *err);

/* The same for streams of n[k] symbols with table indices tab[k] each (NULL: one table): two
 * halves of one plane (context stream format 4). */
int ckz_rans32_decode_tab2x(const uint32_t *const T[2], const uint8_t *const tab[2],
                            const unsigned shift[2], const uint8_t *const in[2],
                            const size_t len[2], uint8_t *const out[2], const size_t n[2],
                            ckz_err *err);

#endif /* CKZ_RANS_H */
