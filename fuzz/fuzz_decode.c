/* fuzz_decode.c - libFuzzer harness for the stream decoders (the C entry points, not Python).
 *
 * Input: one control byte, then a stream.  The control byte picks the destination length (the
 * declared one, or one off) and the plane parameters, so every path is reached: decoded_size,
 * decode, decode_planes with matching and mismatching element sizes, and decode_planes2 (two
 * chunks at once) on the stream beside a copy with one byte flipped.  Any outcome but a crash,
 * a sanitizer report or a leak is fine.  Successful plain and fused decodes must agree, and a
 * successful paired decode must give what decode_planes gives on each stream.
 *
 * A stream whose first byte is a context format (3, or the older 2) goes to decode_planes_ctx
 * instead, with the context fuzz_context(i, ctl) (fuzz/make_corpus.py builds its seeds with the same function),
 * elem_size 1 << ((ctl >> 2) & 3), and one context byte too many when ctl & 3 == 3.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
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
    if (len && ckz_is_ctx_format(src[0]))
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
    /* The paired decode (two chunks at once): the stream beside itself, and beside its copy with
     * one byte flipped; where it succeeds, each half is what the one-by-one decode gives. */
    uint8_t *flipped = malloc(len ? len : 1), *d0 = malloc(dst_len ? dst_len : 1);
    uint8_t *d1 = malloc(dst_len ? dst_len : 1);
    if (!flipped || !d0 || !d1) abort();
    memcpy(flipped, src, len);
    if (len) flipped[(size_t)ctl * 2654435761u % len] ^= (uint8_t)(1u << (ctl & 7));
    uint8_t *e = malloc(dst_len ? dst_len : 1);
    if (!e) abort();
    int re = ckz_decode_planes(flipped, len, e, dst_len, elem_size, rotate, &err);
    const uint8_t *pair_src[2] = {src, flipped};
    const size_t pair_len[2] = {len, len};
    uint8_t *const pair_dst[2] = {d0, d1};
    if (!ckz_decode_planes2(pair_src, pair_len, pair_dst, dst_len, elem_size, rotate)) {
        if (rb || re || memcmp(d0, b, dst_len) || memcmp(d1, e, dst_len)) abort();
    }
    free(e);
    free(flipped);
    free(d0);
    free(d1);
    free(a);
    free(b);
    return 0;
}
