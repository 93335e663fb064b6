/* ASan/UBSan driver of ckz_sum_squares and ckz_floats_equal (session 37): from src/ckptzip/_native/core,
 * gcc -O1 -g -std=c11 -fsanitize=address,undefined -fno-sanitize-recover=all -I. drive.c quantize.c common.c -lm
 * then run with CKZ_CPU=baseline and CKZ_CPU=all: "total 6.078259e+10 eq 2200" both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quantize.h"
int main(void) {
    double total = 0; int eq = 0;
    for (size_t n = 0; n < 1100; n++) {
        for (size_t es = 4; es <= 8; es += 4) {
            unsigned char *a = malloc(n * es + 1), *b = malloc(n * es + 1);
            for (size_t i = 0; i < n * es; i++) { a[i] = (unsigned char)(i * 7); b[i] = a[i]; }
            if (es == 4) for (size_t i = 0; i < n; i++) { ((float *)a)[i] = (float)i * 0.5f; ((float *)b)[i] = (float)i * 0.5f; }
            else for (size_t i = 0; i < n; i++) { ((double *)a)[i] = (double)i * 0.5; ((double *)b)[i] = (double)i * 0.5; }
            total += ckz_sum_squares(a, NULL, es, n) + ckz_sum_squares(a, b, es, n);
            eq += ckz_floats_equal(a, b, es, n);
            if (n) { if (es == 4) ((float *)b)[n - 1] += 1; else ((double *)b)[n - 1] += 1; eq -= ckz_floats_equal(a, b, es, n); }
            free(a); free(b);
        }
    }
    printf("total %.6e eq %d\n", total, eq);
    return 0;
}
