/* common.h - shared helpers of the ckptzip native core.
 *
 * Little-endian loads and stores through memcpy (any alignment, compiles to one mov), the error
 * record every fallible entry point fills, and the CPU-dispatch macro.  Nothing here allocates or
 * holds state, so every function of the core is thread-safe once module init has run.
 */
#ifndef CKZ_COMMON_H
#define CKZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Error record: a fallible function returns 0 on success, -1 on failure with msg filled in.
 * Lives on the caller's stack, so threads never share one. */
#define CKZ_ERRMSG_CAP 200
typedef struct {
    char msg[CKZ_ERRMSG_CAP];
} ckz_err;

int ckz_fail(ckz_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static inline uint32_t ckz_load16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    return v;
}

static inline uint32_t ckz_load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t ckz_load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline void ckz_store32(uint8_t *p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}

static inline void ckz_store64(uint8_t *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* CPU dispatch.  The wheel targets the x86-64 baseline (SSE2); hot loops are compiled a second
 * time for "v3" CPUs (AVX2 + BMI2: 256-bit vectors, flag-free variable shifts) and picked at run
 * time.  CKZ_VERSIONED(name, params, args) defines `name` calling the always-inline `name##_impl`
 * through the best variant; ckz_cpu_v3 is written once by ckz_cpu_init (module init) and only
 * read afterwards.  Elsewhere (aarch64: NEON is baseline) there is one variant. */
extern int ckz_cpu_v3;
/* AVX-512 F, BW and VBMI as well (byte permutes across a whole 64-byte vector): the plane
 * kernels of 2- and 4-byte elements use it where it exists (Ice Lake and later, Zen 4). */
extern int ckz_cpu_v4;
/* AVX-512 VBMI2 as well (byte compress and expand): format 4's escapes (ctx.c). */
extern int ckz_cpu_vbmi2;
void ckz_cpu_init(void);
/* Everything the core needs before its first call, once: CPU dispatch, then the CRC-32C and rANS
 * tables (the Python module's init and the fuzz harnesses call it). */
void ckz_init(void);

#define CKZ_INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__) && !defined(CKZ_NO_DISPATCH)
#define CKZ_VERSIONED(name, params, args)                                                      \
    static void name##_base params { name##_impl args; }                                       \
    __attribute__((target("avx2,bmi2"))) static void name##_v3 params { name##_impl args; }    \
    static void name params {                                                                  \
        if (ckz_cpu_v3) name##_v3 args;                                                        \
        else name##_base args;                                                                 \
    }
#else
#define CKZ_VERSIONED(name, params, args)                                                      \
    static void name params { name##_impl args; }
#endif

#endif /* CKZ_COMMON_H */
