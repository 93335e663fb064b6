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
 * and tables on whatever the fuzzer's streams decode to).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    if (ckz_encode_planes_ctx(d, ctx, n, width, rotate, enc, &len, &err)) abort();
    if (len > ckz_encode_ctx_bound(n, width) || enc[0] != CKZ_CTX_FORMAT) abort();
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
    if (len && (src[0] == CKZ_CTX_FORMAT || src[0] == CKZ_CTX_FORMAT2)) {
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
    free(dst);
    return 0;
}
