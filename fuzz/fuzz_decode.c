/* fuzz_decode.c - libFuzzer harness for the stream decoder (the C entry points, not Python).
 *
 * Input: one control byte, then a stream.  The control byte picks the destination length (the
 * declared one, or one off) and the plane parameters, so every path is reached: decoded_size,
 * decode, decode_planes with matching and mismatching element sizes.  Any outcome but a crash,
 * a sanitizer report or a leak is fine.  Successful plain and fused decodes must agree.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "crc32c.h"
#include "stream.h"

#define MAX_OUT (1u << 24) /* skip streams declaring more than 16 MiB: memory, not safety */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    ckz_cpu_init();
    ckz_crc32c_init();
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
