/* fuzz_delta.c - libFuzzer harness for the decode of a delta chunk, as the reader runs it:
 * the stream (format 1 via decode_planes, or formats 3 and 2 via decode_planes_ctx with the
 * context that context_bytes derives from the base chunk), then residual_decode against the
 * base.
 *
 * Input: control byte | u32 LE base length L | L base bytes | stream.  Control byte bits 0-1:
 * residual kind (3 is an invalid kind, which must be refused), bits 2-3: log2 of the element
 * width, bits 4-7: plane rotation.  The destination has L bytes, like the chunk's raw length.
 * Any outcome but a crash, a sanitizer report or a leak is fine.  Invariants checked:
 * residual_encode(residual_decode(d, base), base) == d (the residual is a bijection), the
 * in-place decode (dst == delta) equals the out-of-place one, and a context stream that decodes
 * re-encodes (format 3) to a stream that decodes to the same bytes (the encoder's plane modes
 * and tables on whatever the fuzzer's streams decode to).  The one-call entry the reader takes,
 * ckz_chunk_decode, runs on the same input and must agree with the stages: the same outcome and,
 * on success, the same bytes; the stream it then re-encodes (ckz_chunk_encode, and its size-only
 * form) must decode back to them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "common.h"
#include "ctx.h"
#include "residual.h"
#include "stream.h"

#define MAX_BASE (1u << 22) /* 4 MiB: plenty for max_len inputs, a guard against the u32 */
#define CONTEXT_ROTATE 1    /* codecs/context.py: the exponent byte of a float */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    ckz_init();
    return 0;
}

/* encode_planes_ctx(d) must decode back to d. */
static void check_reencode(const uint8_t *d, const uint8_t *ctx, size_t n, unsigned width,
                           unsigned rotate) {
    ckz_err err;
    size_t bytes = n * width, len = 0;
    uint8_t *enc = malloc(ckz_encode_ctx_bound(n, width)), *back = malloc(bytes ? bytes : 1);
    if (!enc || !back) abort();
    if (ckz_encode_planes_ctx(d, ctx, n, width, rotate, CKZ_CTX_FORMAT, enc, &len, &err))
        abort();
    if (len > ckz_encode_ctx_bound(n, width) || !ckz_is_ctx_format(enc[0])) abort();
    if (ckz_decode_planes_ctx(enc, len, ctx, n, back, bytes, width, rotate, &err)) abort();
    if (memcmp(back, d, bytes)) abort();
    free(enc);
    free(back);
}

static void check_residual(const uint8_t *delta, const uint8_t *base, size_t len, unsigned width,
                           unsigned kind) {
    size_t n = len / width, bytes = n * width;
    uint8_t *x = malloc(bytes ? bytes : 1), *y = malloc(bytes ? bytes : 1),
            *z = malloc(bytes ? bytes : 1);
    if (!x || !y || !z) abort();
    int ra = ckz_residual_decode(delta, base, x, n, width, kind);
    if (kind >= CKZ_RESIDUAL_KINDS) {
        if (!ra) abort(); /* an unknown kind must be refused */
    } else {
        if (ra) abort();
        memcpy(y, delta, bytes);
        if (ckz_residual_decode(y, base, y, n, width, kind)) abort(); /* in place */
        if (memcmp(x, y, bytes)) abort();
        if (ckz_residual_encode(x, base, z, n, width, kind)) abort();
        if (memcmp(z, delta, bytes)) abort(); /* bijection */
    }
    free(x);
    free(y);
    free(z);
}

/* ckz_chunk_decode on the input must do what the stages did (staged_rc, and on success the
 * stream decodes to staged, the residual not yet inverted); a success re-encodes to a stream
 * that decodes back, of the length the size-only encode gives. */
static void check_chunk(const uint8_t *src, size_t len, const uint8_t *base, size_t base_len,
                        unsigned width, unsigned rotate, unsigned kind, int staged_rc,
                        const uint8_t *staged) {
    int ctx = len && ckz_is_ctx_format(src[0]);
    ckz_chunk_spec spec = {width, rotate, kind < CKZ_RESIDUAL_KINDS ? (int)kind : -1,
                           ctx ? CONTEXT_ROTATE % (int)(8 * width) : -1};
    ckz_err err;
    if (ckz_chunk_spec_check(&spec, &err)) return; /* width 1 with a context, or none */
    uint8_t *out = malloc(base_len ? base_len : 1), *want = malloc(base_len ? base_len : 1);
    if (!out || !want) abort();
    int rc = ckz_chunk_decode(src, len, base, out, base_len, &spec, &err);
    if (!rc != !staged_rc) abort();
    if (!rc) {
        size_t n = base_len / width; /* base_len % width == 0: the decode checked it */
        memcpy(want, staged, base_len);
        if (spec.kind >= 0 &&
            ckz_residual_decode(want, base, want, n, width, (unsigned)spec.kind))
            abort();
        if (memcmp(out, want, base_len)) abort();
        size_t bound = ckz_chunk_bound(base_len, &spec), elen = 0, slen = 0;
        uint8_t *enc = malloc(bound), *back = malloc(base_len ? base_len : 1);
        if (!enc || !back) abort();
        if (ckz_chunk_encode(out, base, base_len, &spec, enc, &elen, &err) ||
            ckz_chunk_encode(out, base, base_len, &spec, NULL, &slen, &err))
            abort();
        if (elen > bound || slen != elen) abort();
        if (ckz_chunk_decode(enc, elen, base, back, base_len, &spec, &err)) abort();
        if (memcmp(back, out, base_len)) abort();
        free(enc);
        free(back);
    }
    free(out);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 5) return 0;
    uint8_t ctl = data[0];
    uint32_t base_len = ckz_load32(data + 1);
    if (base_len > MAX_BASE || base_len > size - 5) return 0;
    const uint8_t *base = data + 5, *src = base + base_len;
    size_t len = size - 5 - base_len;
    unsigned kind = ctl & 3, width = 1u << ((ctl >> 2) & 3), rotate = (ctl >> 4) % (8 * width);
    ckz_err err;
    uint8_t *dst = malloc(base_len ? base_len : 1);
    if (!dst) abort();
    int rc;
    if (len && ckz_is_ctx_format(src[0])) {
        size_t n = base_len / width;
        uint8_t *ctx = malloc(n ? n : 1);
        if (!ctx) abort();
        /* context_bytes reads whole elements; a ragged tail makes the decode refuse dst */
        ckz_context_bytes(base, n, width, CONTEXT_ROTATE % (8 * width), ctx);
        rc = ckz_decode_planes_ctx(src, len, ctx, n, dst, base_len, width, rotate, &err);
        if (!rc) check_reencode(dst, ctx, n, width, rotate);
        free(ctx);
    } else {
        rc = ckz_decode_planes(src, len, dst, base_len, width, rotate, &err);
    }
    if (!rc && base_len % width == 0) check_residual(dst, base, base_len, width, kind);
    check_chunk(src, len, base, base_len, width, rotate, kind, rc, dst);
    free(dst);
    return 0;
}
