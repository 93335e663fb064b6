/* ctx.h - byte planes coded against a per-element context: the stream of encode_planes_ctx
 * (stream format 3; format 2 is still decoded; docs/STREAMS.md has both layouts).
 *
 * Each element i has one context byte ctx[i] that the encoder and the decoder both know (for an
 * incremental checkpoint: the base tensor's exponent byte, from ckz_context_bytes).  The context
 * values are cut into buckets, contiguous value ranges of at least ckz_ctx_min_bucket(n) elements,
 * by a rule that depends on the context histogram alone, so the decoder recomputes it and nothing
 * about the buckets but their count is stored.  Format 3 codes each byte plane, in element order,
 * as RAW, CONST, one RANS32 stream with one table, or one RANS32 stream whose symbol i uses the
 * table of element i's bucket.  Format 2 stored each plane as one segment per bucket (RAW, CONST,
 * HUFF or RANS, as in stream.h), the plane's bytes permuted into bucket order: by context value,
 * then by lane, then by index, where lane l is the l-th of CKZ_CTX_LANES near-equal runs of
 * elements (ckz_quarter_start/count, hist.h).
 *
 * Files: ctx.c the shared model (context bytes, buckets, bucket indices, escape tables),
 * ctx_encode.c the encoder, ctx_decode.c the decoder of formats 3 and 4, ctx_format2.c format 2's
 * decoder; ctx_internal.h is what they share.
 */
#ifndef CKZ_CTX_H
#define CKZ_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "hist.h"
#include "stream.h"

#define CKZ_CTX_FORMAT 0x04      /* first byte of the context stream written now (format 4) */
#define CKZ_CTX_FORMAT3 0x03     /* format 3, still decoded (and written for 1-byte elements) */
#define CKZ_CTX_FORMAT2 0x02     /* format 2, still decoded: planes permuted into bucket order */
#define CKZ_CTX_MODE_BUCKETED 5  /* format 3 plane mode: RANS32 with one table per bucket */
#define CKZ_CTX_MODE_HALVES 6    /* format 4 plane mode: the same tables, two streams (halves) */
#define CKZ_CTX_LANES CKZ_HIST_QUARTERS /* element runs with their own cursors (format 2) */
/* Bucket bounds (format constants: the decoder recomputes the buckets with them).  Measured on
 * real GPT deltas, 256 KiB chunks: (2048, 32) vs (4096, 16) +0.5 % ratio at 10 steps apart,
 * +0.1 % at 50 and 210; (1024, 64) another +0.1 %; (8192, 8) -2 %. */
#define CKZ_CTX_MIN_BUCKET 2048  /* elements a bucket needs at least (a table costs 10-80 B) */
#define CKZ_CTX_MAX_BUCKETS 32   /* buckets per plane at most: larger chunks get larger buckets */
#define CKZ_CTX_HEADER (1 + CKZ_MAX_VARINT + 1 + CKZ_MAX_VARINT) /* format, n, elem_size, B */
#define CKZ_CTX_MAX_ELEMENTS 0xffffffffull /* per call: the context histograms count in 32 bits */

/* Whether b is the first byte of a context stream of some format (4, 3 or 2). */
static inline int ckz_is_ctx_format(unsigned b) {
    return b == CKZ_CTX_FORMAT || b == CKZ_CTX_FORMAT3 || b == CKZ_CTX_FORMAT2;
}

/* Element sizes the context coder takes: the IEEE and integer widths. */
static inline int ckz_ctx_elem_ok(unsigned elem_size) {
    return elem_size == 1 || elem_size == 2 || elem_size == 4 || elem_size == 8;
}

/* ctx[i] = byte elem_size-1 of rotl(element i, rotate) = plane elem_size-1 of split_planes, for
 * n elements (the exponent byte of a float with the usual rotation). */
void ckz_context_bytes(const uint8_t *src, size_t n, unsigned elem_size, unsigned rotate,
                       uint8_t *ctx);

/* Fills the escape kernels' shuffle tables; once, before any coding (ckz_init calls it). */
void ckz_ctx_init(void);

/* Largest stream ckz_encode_planes_ctx produces for n elements. */
size_t ckz_encode_ctx_bound(size_t n, unsigned elem_size);

/* Codes n <= CKZ_CTX_MAX_ELEMENTS elements of src (n * elem_size bytes) against the context
 * ctx[0..n).  Fails (-1, err set) only when the scratch allocation (n * elem_size bytes) fails.
 * out NULL: sets *out_len to the stream's exact length without writing it. */
int ckz_encode_planes_ctx(const uint8_t *src, const uint8_t *ctx, size_t n, unsigned elem_size,
                          unsigned rotate, unsigned format, uint8_t *out, size_t *out_len,
                          ckz_err *err);

/* Decodes a stream of ckz_encode_planes_ctx into dst (dst_len bytes) given the same context
 * (ctx_len bytes); checks that ctx_len is the stream's element count, dst_len its byte count,
 * elem_size the stored one, and the stored bucket count the one the context yields. */
int ckz_decode_planes_ctx(const uint8_t *src, size_t len, const uint8_t *ctx, size_t ctx_len,
                          uint8_t *dst, size_t dst_len, unsigned elem_size, unsigned rotate,
                          ckz_err *err);

/* The same, then (base not NULL) the residual of `kind` (residual.h) inverted against
 * base[0..dst_len) in dst, block by block behind the merge while the bytes are in L1. */
int ckz_decode_planes_ctx_residual(const uint8_t *src, size_t len, const uint8_t *ctx,
                                   size_t ctx_len, uint8_t *dst, size_t dst_len,
                                   unsigned elem_size, unsigned rotate, const uint8_t *base,
                                   int kind, ckz_err *err);

/* Validates a format-2 header and returns its decoded length in bytes. */
int ckz_ctx_decoded_size(const uint8_t *src, size_t len, uint64_t *n, ckz_err *err);

#endif /* CKZ_CTX_H */
