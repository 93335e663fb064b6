/* fuzz_decode.c - libFuzzer harness for the stream decoders (the C entry points, not Python).
 *
 * Input: one control byte, then a stream.  The control byte picks the destination length (the
 * declared one, or one off) and the plane parameters, so every path is reached: decoded_size,
 * decode, decode_planes with matching and mismatching element sizes.  Any outcome but a crash,
 * a sanitizer report or a leak is fine.  Successful plain and fused decodes must agree.
 *
 * A stream whose first byte is a context format (3, or the older 2) goes to decode_planes_ctx
 * instead, with the context fuzz_context(i, ctl) (fuzz/make_corpus.py builds its seeds with the same function),
 * elem_size 1 << ((ctl >> 2) & 3), and one context byte too many when ctl & 3 == 3.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "crc32c.h"
#include "ctx.h"
#include "stream.h"

#define MAX_OUT (1u << 24) /* skip streams declaring more than 16 MiB: memory, not safety */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    ckz_init();
    return 0;
}

/* 16 context values spread over the elements, shifted by the control byte. */
static uint8_t fuzz_context(size_t i, uint8_t ctl) {
    return (uint8_t)(ctl ^ (uint8_t)((uint32_t)(i * 0x9E3779B1u) >> 28));
}

static int fuzz_ctx(uint8_t ctl, const uint8_t *src, size_t len) {
    ckz_err err;
    uint64_t bytes;
    unsigned elem_size = 1u << ((ctl >> 2) & 3), rotate = (ctl >> 4) % (8 * elem_size);
    if (ckz_decoded_size(src, len, &bytes, &err) || bytes > MAX_OUT) return 0;
    size_t n = (size_t)bytes / elem_size + ((ctl & 3) == 3 ? 1 : 0);
    uint8_t *ctx = malloc(n ? n : 1), *dst = malloc(n * elem_size ? n * elem_size : 1);
    if (!ctx || !dst) abort();
    for (size_t i = 0; i < n; i++) ctx[i] = fuzz_context(i, ctl);
    (void)ckz_decode_planes_ctx(src, len, ctx, n, dst, n * elem_size, elem_size, rotate, &err);
    free(ctx);
    free(dst);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t ctl = data[0];
    const uint8_t *src = data + 1;
    size_t len = size - 1;
    ckz_err err;
    uint64_t n;
    (void)ckz_crc32c(0, src, len);
    if (len && (src[0] == CKZ_CTX_FORMAT || src[0] == CKZ_CTX_FORMAT2))
        return fuzz_ctx(ctl, src, len);
    if (ckz_decoded_size(src, len, &n, &err) || n > MAX_OUT) return 0;
    size_t dst_len = (size_t)n + ((ctl & 3) == 3 ? 1 : 0); /* 1 in 4: wrong length */
    uint8_t *a = malloc(dst_len ? dst_len : 1), *b = malloc(dst_len ? dst_len : 1);
    if (!a || !b) abort();
    unsigned elem_size = 1 + ((ctl >> 2) & 7), rotate = (ctl >> 5) % (8 * elem_size);
    int ra = ckz_decode(src, len, a, dst_len, &err);
    int rb = ckz_decode_planes(src, len, b, dst_len, elem_size, rotate, &err);
    if (!ra && !rb) {
        /* Same stream: the fused decode equals merge(decode). */
        uint8_t *c = malloc(dst_len ? dst_len : 1);
        if (!c) abort();
        const uint8_t *planes[CKZ_MAX_ELEM_SIZE];
        size_t m = dst_len / elem_size;
        for (unsigned p = 0; p < elem_size; p++) planes[p] = a + p * m;
        ckz_merge_planes(planes, c, m, elem_size, rotate);
        if (memcmp(b, c, dst_len)) abort();
        free(c);
    }
    free(a);
    free(b);
    return 0;
}
