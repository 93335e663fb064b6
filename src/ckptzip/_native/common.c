/* common.c - the error record's formatter. */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>

int ckz_fail(ckz_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}
