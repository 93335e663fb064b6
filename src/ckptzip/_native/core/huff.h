/* huff.h - static Huffman coding of one byte segment in CKZ_HUF_STREAMS interleaved bitstreams.
 *
 * Codes are canonical, at most CKZ_HUF_MAX_BITS long, and written LSB-first, so the decoder peeks
 * the low CKZ_HUF_MAX_BITS bits of a 64-bit buffer and looks them up in a table whose entry yields
 * up to CKZ_HUF_MULTI symbols at once.  A segment of n symbols is cut into CKZ_HUF_STREAMS
 * quarters (ckz_quarter_count, hist.h); quarter k is coded into its own bitstream, so the decoder
 * runs CKZ_HUF_STREAMS independent dependency chains.  The histograms the encoder plans with are
 * hist.h's.
 */
#ifndef CKZ_HUFF_H
#define CKZ_HUFF_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "hist.h"

#define CKZ_HUF_MAX_BITS 11 /* longest code; also the decode table's index width */
#define CKZ_HUF_TABLE_SIZE (1u << CKZ_HUF_MAX_BITS)
#define CKZ_HUF_STREAMS CKZ_HIST_QUARTERS /* stream k codes quarter k (hist.h) */
#define CKZ_HUF_MULTI 4 /* symbols one decode-table entry may yield (one 32-bit store) */

/* Code lengths (0 = unused symbol, else 1..CKZ_HUF_MAX_BITS) for a histogram with at least two
 * used symbols.  The code is complete: sum of 2^-len over used symbols is exactly 1. */
void ckz_huf_build_lengths(const uint64_t total[256], uint8_t len[256]);

/* Serialized table: byte `first`, byte `count - 1`, then ceil(count/2) bytes of 4-bit lengths of
 * symbols first..first+count-1, low nibble first.  Size in bytes, and the writer. */
size_t ckz_huf_table_size(const uint8_t len[256]);
size_t ckz_huf_write_table(const uint8_t len[256], uint8_t *out);

/* Parses and validates a table from in[0..avail): every length <= CKZ_HUF_MAX_BITS, at least two
 * used symbols, Kraft sum exactly 1.  Sets *used_bytes and returns 0, or returns -1. */
int ckz_huf_read_table(const uint8_t *in, size_t avail, uint8_t len[256], size_t *used_bytes,
                       ckz_err *err);

/* Exact byte size of one stream holding `count` symbols (the sizes ckz_huf_encode needs). */
size_t ckz_huf_stream_bytes(const uint32_t count[256], const uint8_t len[256]);

/* Encodes src[0..n) (every symbol must have len > 0) as CKZ_HUF_STREAMS streams laid end to end
 * at out, stream k being size[k] bytes (from ckz_huf_stream_bytes over quarter k).  Writes
 * exactly the sum of size[] bytes. */
void ckz_huf_encode(const uint8_t *src, size_t n, const uint8_t len[256],
                    const size_t size[CKZ_HUF_STREAMS], uint8_t *out);

/* Decode tables, indexed by the next CKZ_HUF_MAX_BITS bits of a stream.
 * single[i]: symbol | code length << 8.
 * multi[i] (built only when `use_multi`): up to CKZ_HUF_MULTI whole codes, packing
 *   bits  0..7   bits consumed by all symbols of the entry
 *   bits  8..15  number of symbols (1..CKZ_HUF_MULTI)
 *   bits 16..31  cumulative code length after symbol t, 4 bits each (t = 0..3)
 *   bits 32..63  the symbols, byte t = symbol t
 * The multi-symbol table pays for short codes (exponent planes, ~2.6 bits); for long ones
 * (mantissa-like planes, ~7 bits) an entry rarely holds two codes and the single table is
 * cheaper per symbol. */
typedef struct {
    int use_multi;
    /* L when every used code is L <= 8 bits long (a complete code of 2^L symbols: a flat plane,
     * such as an Adam exp_avg_sq's low mantissa byte beside its constant sign bit), else 0: the
     * stream is then fields of L bits, decoded without a bit buffer's bookkeeping. */
    unsigned fixed_bits;
    uint8_t fixed_sym[256]; /* fixed_bits: the symbol of each field value, else zeros */
    uint16_t single[CKZ_HUF_TABLE_SIZE];
    uint64_t multi[CKZ_HUF_TABLE_SIZE];
} ckz_huf_dtable;

void ckz_huf_build_dtable(const uint8_t len[256], ckz_huf_dtable *t);

/* Decodes CKZ_HUF_STREAMS streams (stream k at in[k], size[k] bytes) into out[0..n), quarter k
 * from stream k.  Fails if any stream is not consumed to exactly its last byte. */
int ckz_huf_decode(const ckz_huf_dtable *t, const uint8_t *const in[CKZ_HUF_STREAMS],
                   const size_t size[CKZ_HUF_STREAMS], uint8_t *out, size_t n, ckz_err *err);

#endif /* CKZ_HUFF_H */
