/* common.c - the error record's formatter, CPU dispatch and the core's one-time init. */
#include "common.h"

#include "crc32c.h"
#include "ctx.h"
#include "rans.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ckz_fail(ckz_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int ckz_cpu_v3 = 0;
int ckz_cpu_v4 = 0;
int ckz_cpu_vbmi2 = 0;

/* CKZ_CPU in the environment caps the kernels picked, to test and measure the portable ones:
 * "baseline" (SSE2), "v3" (AVX2), "v4" (AVX-512 without VBMI2); anything else, or nothing, takes
 * what the CPU has.  Streams are the same whatever is picked. */
void ckz_cpu_init(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(CKZ_NO_DISPATCH)
    __builtin_cpu_init();
    const char *cap = getenv("CKZ_CPU");
    int level = !cap ? 3 : !strcmp(cap, "baseline") ? 0 : !strcmp(cap, "v3") ? 1
              : !strcmp(cap, "v4") ? 2 : 3;
    ckz_cpu_v3 = level >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
    ckz_cpu_v4 = level >= 2 && ckz_cpu_v3 && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi");
    ckz_cpu_vbmi2 = level >= 3 && ckz_cpu_v4 && __builtin_cpu_supports("avx512vbmi2");
#endif
}

void ckz_init(void) {
    ckz_cpu_init();
    ckz_crc32c_init();
    ckz_rans_init();
    ckz_ctx_init();
}
