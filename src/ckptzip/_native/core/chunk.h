/* chunk.h - the core's top layer: a pipeline's chunk coded in one call, a task's chunks in one
 * call (the batch loops the bindings run without the GIL, with the order of their checks), the
 * decoded size of a stream of any format, and ckz_init.  What the Python bindings and the fuzz
 * harnesses call; it may call every layer below (src/ckptzip/_native/README.md).
 */
#ifndef CKZ_CHUNK_H
#define CKZ_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Everything the core needs before its first call, once: the CPU level (common.h), then the
 * CRC-32C, rANS and context coder's tables (the Python module's init and the fuzz harnesses call
 * it). */
void ckz_init(void);

/* Validates the header of a stream of any format (1, or a context format 4, 3 or 2) and sets *n
 * to the length it declares it decodes to. */
int ckz_decoded_size(const uint8_t *src, size_t len, uint64_t *n, ckz_err *err);

/* ---- one chunk: a pipeline's chunk coding in one call ----------------------------------------
 * The chunk stream of the pipelines [residual(kind, width)?, byteplanes(width, rotate), entropy]
 * (stream format 1, as ckz_encode_planes) and [residual(kind, width), ctxplanes(width, rotate)]
 * (format 3, as ckz_encode_planes_ctx with ckz_context_bytes(base, width, ctx_rotate) as the
 * context), residual, context and coding without intermediate buffers of the caller's. */
typedef struct {
    unsigned width;  /* element bytes: 1, 2, 4 or 8 (2, 4 or 8 with a context) */
    unsigned rotate; /* the planes' rotation, < 8 * width */
    int kind;        /* residual kind, or -1 for none (format 1 only) */
    int ctx_rotate;  /* the context's rotation (< 8 * width), or -1 for byte planes (format 1) */
} ckz_chunk_spec;

/* 0 if the spec is one of the above, else -1 with err set. */
int ckz_chunk_spec_check(const ckz_chunk_spec *spec, ckz_err *err);

/* Largest stream ckz_chunk_encode produces for a chunk of len bytes. */
size_t ckz_chunk_bound(size_t len, const ckz_chunk_spec *spec);

/* Codes the chunk src[0..len) against base[0..len) (NULL when the spec has neither residual
 * nor context) into out (ckz_chunk_bound bytes), or, out NULL, only sets *out_len to the exact
 * length of that stream.  len is a multiple of the width, <= CKZ_MAX_DECODED, and with a
 * context its element count <= CKZ_CTX_MAX_ELEMENTS (the caller checks).  Fails (-1, err set)
 * only when scratch memory runs out. */
int ckz_chunk_encode(const uint8_t *src, const uint8_t *base, size_t len,
                     const ckz_chunk_spec *spec, uint8_t *out, size_t *out_len, ckz_err *err);

/* Decodes a stream of ckz_chunk_encode into dst[0..len) given the same base[0..len) (NULL when
 * the spec has neither residual nor context); validates the stream as ckz_decode_planes and
 * ckz_decode_planes_ctx do.  dst must not overlap src or base. */
int ckz_chunk_decode(const uint8_t *src, size_t src_len, const uint8_t *base, uint8_t *dst,
                     size_t len, const ckz_chunk_spec *spec, ckz_err *err);

/* Whether a chunk of len bytes is beyond what one call codes: CKZ_MAX_DECODED bytes, and with a
 * context CKZ_CTX_MAX_ELEMENTS elements. */
int ckz_chunk_too_large(size_t len, const ckz_chunk_spec *spec);

/* ---- a task's chunks in one call ------------------------------------------------------------
 * On many cores, a call per chunk made each coding thread take the GIL back half a dozen times a
 * chunk (the call, its result, two checksums), queueing behind the others: the bindings hand a
 * task's run of chunks to these loops and release the GIL once for all of them. */
typedef struct {
    ckz_chunk_spec spec;   /* checked (ckz_chunk_spec_check) */
    const uint8_t *base;   /* the base chunk (len bytes), or NULL when the spec needs none */
    const uint8_t *raw;    /* encode: the chunk (len bytes) */
    uint8_t *dst;          /* decode: where the chunk goes (len bytes) */
    size_t len;            /* the chunk's raw bytes */
    const uint8_t *stream; /* its stored stream (encode: set to where it was written) */
    size_t stream_len;     /* the stream's bytes (encode: set) */
    uint32_t crc;          /* CRC-32C of the stream (encode: set; decode: checked before) */
    uint32_t raw_crc;      /* CRC-32C of the raw chunk (encode: set; decode: checked after) */
} ckz_chunk_item;

/* Codes items[0..count) one after another into out (room for the sum of their ckz_chunk_bound),
 * setting each one's stream, stream_len, crc and raw_crc; *used receives the bytes written.
 * -1 with *failed the item and err set when scratch memory runs out. */
int ckz_chunk_encode_batch(ckz_chunk_item *items, size_t count, uint8_t *out, size_t *used,
                           size_t *failed, ckz_err *err);

/* How a chunk of ckz_chunk_decode_batch fails. */
enum {
    CKZ_CHUNK_BAD_CRC = 0,     /* the stream fails its checksum */
    CKZ_CHUNK_MALFORMED = 1,   /* a malformed stream: err says how */
    CKZ_CHUNK_BAD_RAW_CRC = 2, /* the decoded bytes fail their checksum */
};

/* For each item in order: the stream's CRC-32C checked against crc, the stream decoded into dst,
 * dst's CRC-32C checked against raw_crc.  Two consecutive dense chunks (no residual, no context;
 * one width, rotation and length) whose stream CRCs pass are decoded together
 * (ckz_decode_planes2); when that fails they are decoded again one by one, so the outcome and
 * the first error are those of decoding chunk by chunk.  0 when every chunk passes, else -1
 * with *failed the first that fails and *what how (CKZ_CHUNK_*). */
int ckz_chunk_decode_batch(const ckz_chunk_item *items, size_t count, size_t *failed, int *what,
                           ckz_err *err);

#endif /* CKZ_CHUNK_H */
