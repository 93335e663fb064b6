/* rans.h - static rANS (32-bit states, 16-bit renormalization) for segments where Huffman's
 * whole-bit codes waste too much: low-entropy planes whose top symbol has probability near or
 * above 1/2.
 *
 * Same stream layout as huff.h: a segment's n symbols are cut into CKZ_HUF_STREAMS quarters
 * (ckz_huf_stream_count), quarter k coded into its own stream, so the decoder runs that many
 * independent state chains.  Frequencies are normalized to sum 2^CKZ_RANS_PROB_BITS.
 */
#ifndef CKZ_RANS_H
#define CKZ_RANS_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "huff.h"

#define CKZ_RANS_PROB_BITS 12
#define CKZ_RANS_PROB_SCALE (1u << CKZ_RANS_PROB_BITS)
#define CKZ_RANS_L (1u << 16) /* state lower bound; states live in [L, 2^32), renormalized by
                                 16-bit little-endian words */

/* freq[s] > 0 for every symbol with total[s] > 0, summing to CKZ_RANS_PROB_SCALE.  Needs at
 * least two used symbols. */
void ckz_rans_normalize(const uint64_t total[256], uint64_t n, uint16_t freq[256]);

/* Serialized table: byte `first`, byte `count - 1`, then a LEB128 frequency per symbol of
 * first..first+count-1 (0 = unused).  Size, writer, validating reader (sets *used_bytes and
 * returns 0, or returns -1; checks every frequency, the range and the exact sum). */
size_t ckz_rans_table_size(const uint16_t freq[256]);
size_t ckz_rans_write_table(const uint16_t freq[256], uint8_t *out);
int ckz_rans_read_table(const uint8_t *in, size_t avail, uint16_t freq[256], size_t *used_bytes,
                        ckz_err *err);

/* Worst-case bytes ckz_rans_encode needs in `scratch` for n symbols. */
size_t ckz_rans_scratch_size(size_t n);

/* Codes src[0..n) into CKZ_HUF_STREAMS streams built backwards inside scratch; on return
 * stream k is start[k][0..size[k]).  Every symbol of src must have freq > 0. */
void ckz_rans_encode(const uint8_t *src, size_t n, const uint16_t freq[256], uint8_t *scratch,
                     const uint8_t *start[CKZ_HUF_STREAMS], size_t size[CKZ_HUF_STREAMS]);

/* Decodes the streams into out[0..n).  Fails unless each stream is consumed exactly and every
 * state returns to its initial value. */
int ckz_rans_decode(const uint16_t freq[256], const uint8_t *const in[CKZ_HUF_STREAMS],
                    const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n, ckz_err *err);

#endif /* CKZ_RANS_H */
