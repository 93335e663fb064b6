/* chunk.c - the core's top layer (see chunk.h): a pipeline's chunk in one call, the batch loops
 * of encode_chunks/decode_chunks with their policy (pairing chunks, the order of the CRC checks),
 * the decoded size of a stream of any format, and the core's one-time init.
 */
#include "chunk.h"

#include "crc32c.h"
#include "ctx.h"
#include "memory.h"
#include "rans.h"
#include "residual.h"
#include "stream.h"

void ckz_init(void) {
    ckz_cpu_init();
    ckz_crc32c_init();
    ckz_rans_init();
    ckz_ctx_init();
}

int ckz_decoded_size(const uint8_t *src, size_t len, uint64_t *n, ckz_err *err) {
    if (len && ckz_is_ctx_format(src[0])) return ckz_ctx_decoded_size(src, len, n, err);
    return ckz_stream_decoded_size(src, len, n, err);
}

/* ---- one chunk -------------------------------------------------------------------------------- */

int ckz_chunk_spec_check(const ckz_chunk_spec *spec, ckz_err *err) {
    unsigned w = spec->width;
    if (w != 1 && w != 2 && w != 4 && w != 8)
        return ckz_fail(err, "width %u is not 1, 2, 4 or 8", w);
    if (spec->rotate >= 8 * w)
        return ckz_fail(err, "rotate %u is outside 0..%u for width %u", spec->rotate, 8 * w - 1, w);
    if (spec->kind < -1 || spec->kind >= CKZ_RESIDUAL_KINDS)
        return ckz_fail(err, "residual kind %d is outside -1..%d", spec->kind,
                        CKZ_RESIDUAL_KINDS - 1);
    if (spec->ctx_rotate >= 0) {
        if (w == 1) return ckz_fail(err, "a context needs width 2, 4 or 8");
        if ((unsigned)spec->ctx_rotate >= 8 * w)
            return ckz_fail(err, "context rotate %d is outside 0..%u", spec->ctx_rotate, 8 * w - 1);
        if (spec->kind < 0) return ckz_fail(err, "a context needs a residual");
    } else if (spec->ctx_rotate != -1) {
        return ckz_fail(err, "context rotate %d is negative", spec->ctx_rotate);
    }
    return 0;
}

size_t ckz_chunk_bound(size_t len, const ckz_chunk_spec *spec) {
    return spec->ctx_rotate >= 0 ? ckz_encode_ctx_bound(len / spec->width, spec->width)
                                 : ckz_encode_bound(len, spec->width);
}

/* Scratch: the encoders take CKZ_SCRATCH_PLANES and _STREAMS (the caller _OUTPUT), the decoders
 * CKZ_SCRATCH_DECODE; the residual and the context take the slot the other direction uses. */
int ckz_chunk_encode(const uint8_t *src, const uint8_t *base, size_t len,
                     const ckz_chunk_spec *spec, uint8_t *out, size_t *out_len, ckz_err *err) {
    unsigned w = spec->width;
    size_t n = len / w;
    int ctx = spec->ctx_rotate >= 0;
    size_t need = (spec->kind >= 0 ? len : 0) + (ctx ? n : 0);
    uint8_t *mem = NULL; /* + 1: a pointer to offset even for an empty chunk */
    if ((spec->kind >= 0 || ctx) && !(mem = ckz_scratch_get(CKZ_SCRATCH_DECODE, need + 1)))
        return ckz_fail(err, "out of memory for %zu bytes of residual", need);
    const uint8_t *data = src;
    if (spec->kind >= 0) {
        ckz_residual_encode(src, base, mem, n, w, (unsigned)spec->kind);
        data = mem;
    }
    int rc;
    if (ctx) {
        uint8_t *c = mem + len;
        ckz_context_bytes(base, n, w, (unsigned)spec->ctx_rotate, c);
        rc = ckz_encode_planes_ctx(data, c, n, w, spec->rotate, CKZ_CTX_FORMAT, out, out_len,
                                   err);
    } else {
        rc = ckz_encode_planes(data, len, w, spec->rotate, out, out_len, err);
    }
    if (mem) ckz_scratch_put(CKZ_SCRATCH_DECODE, mem);
    return rc;
}

int ckz_chunk_decode(const uint8_t *src, size_t src_len, const uint8_t *base, uint8_t *dst,
                     size_t len, const ckz_chunk_spec *spec, ckz_err *err) {
    unsigned w = spec->width;
    if (len % w) return ckz_fail(err, "chunk length %zu is not a multiple of width %u", len, w);
    size_t n = len / w;
    int rc;
    if (spec->ctx_rotate >= 0) {
        uint8_t *c = ckz_scratch_get(CKZ_SCRATCH_PLANES, n ? n : 1); /* <= dst's length */
        if (!c) return ckz_fail(err, "out of memory for %zu context bytes", n);
        ckz_context_bytes(base, n, w, (unsigned)spec->ctx_rotate, c);
        /* the residual inverted behind the merge, block by block (spec: kind >= 0) */
        rc = ckz_decode_planes_ctx_residual(src, src_len, c, n, dst, len, w, spec->rotate, base,
                                            spec->kind, err);
        ckz_scratch_put(CKZ_SCRATCH_PLANES, c);
        return rc;
    }
    rc = ckz_decode_planes(src, src_len, dst, len, w, spec->rotate, err);
    if (!rc && spec->kind >= 0) ckz_residual_decode(dst, base, dst, n, w, (unsigned)spec->kind);
    return rc;
}

int ckz_chunk_too_large(size_t len, const ckz_chunk_spec *spec) {
    return (uint64_t)len > CKZ_MAX_DECODED ||
           (spec->ctx_rotate >= 0 && (uint64_t)(len / spec->width) > CKZ_CTX_MAX_ELEMENTS);
}

/* ---- a task's chunks in one call ------------------------------------------------------------ */

int ckz_chunk_encode_batch(ckz_chunk_item *items, size_t count, uint8_t *out, size_t *used,
                           size_t *failed, ckz_err *err) {
    size_t pos = 0;
    for (size_t i = 0; i < count; i++) {
        ckz_chunk_item *it = &items[i];
        size_t n = 0;
        if (ckz_chunk_encode(it->raw, it->base, it->len, &it->spec, out + pos, &n, err)) {
            *failed = i;
            *used = pos;
            return -1;
        }
        it->stream = out + pos;
        it->stream_len = n;
        it->crc = ckz_crc32c(0, out + pos, n);
        it->raw_crc = ckz_crc32c(0, it->raw, it->len);
        pos += n;
    }
    *used = pos;
    return 0;
}

/* Whether two chunks of a batch decode as a pair (ckz_decode_planes2): both dense planes (no
 * residual, no context) of one width, rotation and length. */
static int dense_pair(const ckz_chunk_item *a, const ckz_chunk_item *b) {
    return a->spec.kind < 0 && a->spec.ctx_rotate < 0 && b->spec.kind < 0 &&
           b->spec.ctx_rotate < 0 && a->spec.width == b->spec.width &&
           a->spec.rotate == b->spec.rotate && a->len == b->len;
}

int ckz_chunk_decode_batch(const ckz_chunk_item *items, size_t count, size_t *failed, int *what,
                           ckz_err *err) {
    for (size_t i = 0; i < count; i++) {
        const ckz_chunk_item *it = &items[i];
        const ckz_chunk_item *nx = i + 1 < count ? &items[i + 1] : NULL;
        if (nx && dense_pair(it, nx) && ckz_crc32c(0, it->stream, it->stream_len) == it->crc &&
            ckz_crc32c(0, nx->stream, nx->stream_len) == nx->crc) {
            /* two chunks at once (their rANS planes in one loop); on any failure both are
             * decoded again below, one by one, for the outcome and first error of that */
            const uint8_t *pair_src[2] = {it->stream, nx->stream};
            const size_t pair_len[2] = {it->stream_len, nx->stream_len};
            uint8_t *const pair_dst[2] = {it->dst, nx->dst};
            if (!ckz_decode_planes2(pair_src, pair_len, pair_dst, it->len, it->spec.width,
                                    it->spec.rotate)) {
                if (ckz_crc32c(0, it->dst, it->len) != it->raw_crc) {
                    *failed = i, *what = CKZ_CHUNK_BAD_RAW_CRC;
                    return -1;
                }
                if (ckz_crc32c(0, nx->dst, nx->len) != nx->raw_crc) {
                    *failed = i + 1, *what = CKZ_CHUNK_BAD_RAW_CRC;
                    return -1;
                }
                i++;
                continue;
            }
        }
        if (ckz_crc32c(0, it->stream, it->stream_len) != it->crc) {
            *failed = i, *what = CKZ_CHUNK_BAD_CRC;
            return -1;
        }
        if (ckz_chunk_decode(it->stream, it->stream_len, it->base, it->dst, it->len, &it->spec,
                             err)) {
            *failed = i, *what = CKZ_CHUNK_MALFORMED;
            return -1;
        }
        if (ckz_crc32c(0, it->dst, it->len) != it->raw_crc) {
            *failed = i, *what = CKZ_CHUNK_BAD_RAW_CRC;
            return -1;
        }
    }
    return 0;
}
