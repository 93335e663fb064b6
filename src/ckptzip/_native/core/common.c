/* common.c - the error record's formatter and the CPU level (common.h). */
#include "common.h"

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

int ckz_cpu_level = CKZ_LEVEL_BASELINE;

/* The highest level, capped by CKZ_CPU (common.h), whose every feature the CPU has (and the OS
 * enables: __builtin_cpu_supports reports AVX and AVX-512 only with their register state). */
void ckz_cpu_init(void) {
#if CKZ_DISPATCH
    __builtin_cpu_init();
    const char *cap = getenv("CKZ_CPU");
    int max = !cap                      ? CKZ_LEVEL_VBMI2
              : !strcmp(cap, "baseline") ? CKZ_LEVEL_BASELINE
              : !strcmp(cap, "v2")       ? CKZ_LEVEL_V2
              : !strcmp(cap, "v3")       ? CKZ_LEVEL_V3
              : !strcmp(cap, "v4")       ? CKZ_LEVEL_V4
                                         : CKZ_LEVEL_VBMI2;
#define HAS_(f) &&__builtin_cpu_supports(f)
    int level = CKZ_LEVEL_BASELINE;
    if (max >= CKZ_LEVEL_V2 CKZ_FEATURES_V2(HAS_)) level = CKZ_LEVEL_V2;
    if (max >= CKZ_LEVEL_V3 CKZ_FEATURES_V3(HAS_)) level = CKZ_LEVEL_V3;
    if (max >= CKZ_LEVEL_V4 CKZ_FEATURES_V4(HAS_)) level = CKZ_LEVEL_V4;
    if (max >= CKZ_LEVEL_VBMI2 CKZ_FEATURES_VBMI2(HAS_)) level = CKZ_LEVEL_VBMI2;
#undef HAS_
    ckz_cpu_level = level;
#endif
}
