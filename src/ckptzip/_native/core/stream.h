/* stream.h - the entropy stage's self-describing stream (docs/STREAMS.md has the byte layout).
 *
 * A stream carries n bytes cut into `segments` equal slices (the byte planes of one chunk); each
 * slice is stored RAW, as one CONST byte, or coded with its own table: HUFF (Huffman, fast) or
 * RANS (rANS, for low-entropy slices where Huffman's whole-bit codes lose too much).
 */
#ifndef CKZ_STREAM_H
#define CKZ_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "planes.h"

#define CKZ_STREAM_FORMAT 0x01   /* first byte of every stream: format version */
#define CKZ_MAX_SEGMENTS CKZ_MAX_ELEM_SIZE
#define CKZ_MAX_VARINT 9         /* LEB128 bytes for values < 2^63 */
#define CKZ_MAX_DECODED ((uint64_t)1 << 56) /* declared lengths beyond this are rejected */
/* A segment (or a context stream's plane) is coded only if its body is below CKZ_CODED_NUM /
 * CKZ_CODED_DEN of its raw size: else it is stored RAW (decoded at memcpy speed). */
#define CKZ_CODED_NUM 19
#define CKZ_CODED_DEN 20

/* A rANS segment of fewer than CKZ_RANS_SMALL_LIMIT symbols takes the four-stream RANS layout
 * (mode 3) instead of RANS32 when that is smaller: its 16 bytes of states against 128 are 5-25 %
 * of a small low-entropy segment (a LoRA adapter's quantized codes, a bias's byte planes), and
 * its scalar decode costs microseconds there.  A writer that sizes candidate codings on a sample
 * of a larger tensor gives the sample's segments at least this many symbols, so that it prices
 * them as the tensor's full chunks will be coded (planning.py). */
#define CKZ_RANS_SMALL_LIMIT 4096

enum {
    CKZ_MODE_RAW = 0,
    CKZ_MODE_CONST = 1,
    CKZ_MODE_HUFF = 2,
    CKZ_MODE_RANS = 3,   /* 4 streams of rANS (decoded; no longer written) */
    CKZ_MODE_RANS32 = 4, /* 32-lane interleaved rANS in one word stream */
    CKZ_MODE_LAST = CKZ_MODE_RANS32
};

/* Largest stream ckz_encode can produce for n bytes in `segments` segments: coded segments are
 * never larger than raw ones, so it is n plus the largest header. */
size_t ckz_encode_bound(size_t n, unsigned segments);

/* Encodes src[0..n) (n % segments == 0, 1 <= segments <= CKZ_MAX_SEGMENTS) into out, which has
 * room for ckz_encode_bound bytes.  Returns the stream's length.  Never fails.  out NULL: only
 * the length, exactly, without writing the bodies (a rANS segment is still coded in scratch,
 * since its length is known only then). */
size_t ckz_encode(const uint8_t *src, size_t n, unsigned segments, uint8_t *out);

/* Same stream as ckz_encode(split_planes(src)), built from the elements directly; sets *out_len
 * (out NULL: the length only, as ckz_encode).  Fails (-1, err set) only when the scratch
 * allocation fails. */
int ckz_encode_planes(const uint8_t *src, size_t n, unsigned elem_size, unsigned rotate,
                      uint8_t *out, size_t *out_len, ckz_err *err);

/* Validates the header of a format-1 stream and returns the declared decoded length through *n
 * (chunk.h's ckz_decoded_size takes every format). */
int ckz_stream_decoded_size(const uint8_t *src, size_t len, uint64_t *n, ckz_err *err);

/* Decodes into dst, whose length must equal the declared one. */
int ckz_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t dst_len, ckz_err *err);

/* Decodes a stream of elem_size segments and merges the planes into dst (== merge_planes of
 * ckz_decode's output) without materializing the stored planes. */
int ckz_decode_planes(const uint8_t *src, size_t len, uint8_t *dst, size_t dst_len,
                      unsigned elem_size, unsigned rotate, ckz_err *err);

/* Two streams of ckz_decode_planes with the same element size, rotation and decoded length
 * (consecutive chunks of a tensor) into dst[0] and dst[1]: where a plane is RANS32 in both, the
 * two are decoded in one loop (four independent rANS chains instead of two).  0 when both
 * decode; -1 when either fails, with no error kept: the caller then decodes them one by one,
 * for ckz_decode_planes's outcome and first error. */
int ckz_decode_planes2(const uint8_t *const src[2], const size_t len[2], uint8_t *const dst[2],
                       size_t dst_len, unsigned elem_size, unsigned rotate);

/* ---- building blocks shared with the context coder (ctx.h: its streams are made of them) ---- */

/* LEB128 varints of values < 2^63: writer (returns bytes written, <= CKZ_MAX_VARINT), size, and
 * validating reader (minimal form, at most CKZ_MAX_VARINT bytes, advances *p). */
size_t ckz_put_varint(uint8_t *out, uint64_t v);
size_t ckz_varint_size(uint64_t v);
int ckz_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v, const char *what,
                   ckz_err *err);

/* One self-delimiting segment: u8 mode, then RAW: the m bytes; CONST: u8 value; HUFF/RANS:
 * varint body length, body.  Mode choice as in ckz_encode.  At most CKZ_SEGMENT_OVERHEAD + m
 * bytes. */
#define CKZ_SEGMENT_OVERHEAD (1 + CKZ_MAX_VARINT)
size_t ckz_put_segment(const uint8_t *s, size_t m, uint8_t *out);

/* Reads one segment of m decoded bytes from *p (not past end) into out and advances *p;
 * `seg` only numbers the segment in error messages. */
int ckz_get_segment(const uint8_t **p, const uint8_t *end, uint8_t *out, size_t m, unsigned seg,
                    ckz_err *err);

#endif /* CKZ_STREAM_H */
