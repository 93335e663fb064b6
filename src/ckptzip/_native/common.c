/* common.c - the error record's formatter, CPU dispatch and the core's one-time init. */
#include "common.h"

#include "crc32c.h"
#include "rans.h"

#include <stdarg.h>
#include <stdio.h>

int ckz_fail(ckz_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int ckz_cpu_v3 = 0;
int ckz_cpu_v4 = 0;

void ckz_cpu_init(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(CKZ_NO_DISPATCH)
    __builtin_cpu_init();
    ckz_cpu_v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
    ckz_cpu_v4 = ckz_cpu_v3 && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi");
#endif
}

void ckz_init(void) {
    ckz_cpu_init();
    ckz_crc32c_init();
    ckz_rans_init();
}
