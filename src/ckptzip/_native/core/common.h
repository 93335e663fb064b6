/* common.h - shared helpers of the ckptzip native core.
 *
 * Little-endian loads and stores through memcpy (any alignment, compiles to one mov), the error
 * record every fallible entry point fills, and the CPU levels with their target macros.  The
 * ground floor of the core: it includes nothing of the core's.  Nothing here allocates or holds
 * state but the CPU level, written once by ckz_cpu_init, so every function of the core is
 * thread-safe once ckz_init (chunk.h) has run.
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

/* ---- CPU levels and the target macros ------------------------------------------------------
 * The wheel targets the x86-64 baseline (SSE2); hot loops are compiled again for higher CPU
 * levels and picked at run time.  One level is picked once, by ckz_cpu_init, and only read
 * afterwards.  Each level implies every level below it and adds the features listed beside it;
 * a kernel is compiled with its level's target (CKZ_TARGET_V3 ...) and runs only where
 * ckz_cpu_init found every feature of that list (the same X-macro list gives the target string
 * and the run-time check, so they cannot drift apart):
 *
 *   CKZ_LEVEL_BASELINE  x86-64: SSE2 (the portable loops; elsewhere, e.g. aarch64, the only one)
 *   CKZ_LEVEL_V2        + SSE4.2 (crc32), POPCNT                                  (x86-64-v2)
 *   CKZ_LEVEL_V3        + AVX2, BMI, BMI2                             (x86-64-v3: Haswell, Zen)
 *   CKZ_LEVEL_V4        + AVX-512 F, BW, VL, VBMI (byte permutes across 64 bytes), FMA
 *                                                                   (Ice Lake, Zen 4 and later)
 *   CKZ_LEVEL_VBMI2     + AVX-512 VBMI2 (byte compress and expand), PCLMUL, VPCLMULQDQ
 *                                                   (carry-less multiplies: CRC-32C folding)
 *
 * CKZ_CPU in the environment caps the level, to test and measure the lower ones: "baseline",
 * "v2", "v3", "v4" (AVX-512 without VBMI2), "vbmi2"; anything else, or nothing, takes what the
 * CPU has.  Streams are the same whatever is picked.  Building with -DCKZ_NO_DISPATCH compiles
 * the baseline alone. */
enum { CKZ_LEVEL_BASELINE, CKZ_LEVEL_V2, CKZ_LEVEL_V3, CKZ_LEVEL_V4, CKZ_LEVEL_VBMI2 };

#define CKZ_FEATURES_V2(X) X("sse4.2") X("popcnt")
#define CKZ_FEATURES_V3(X) CKZ_FEATURES_V2(X) X("avx2") X("bmi") X("bmi2")
#define CKZ_FEATURES_V4(X)                                                                     \
    CKZ_FEATURES_V3(X) X("avx512f") X("avx512bw") X("avx512vl") X("avx512vbmi") X("fma")
#define CKZ_FEATURES_VBMI2(X) CKZ_FEATURES_V4(X) X("avx512vbmi2") X("pclmul") X("vpclmulqdq")

/* The level ckz_cpu_init picked (CKZ_LEVEL_BASELINE until then). */
extern int ckz_cpu_level;
#define CKZ_CPU_AT(level) (ckz_cpu_level >= CKZ_LEVEL_##level)
/* Picks the level (the Python module's init and the fuzz harnesses call it, by ckz_init). */
void ckz_cpu_init(void);

#define CKZ_INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__) && !defined(CKZ_NO_DISPATCH)
#define CKZ_DISPATCH 1
/* target("sse2,<the level's features>"): sse2 (baseline) only starts the comma list */
#define CKZ_FEATURE_STRING_(f) "," f
#define CKZ_TARGET_(LIST) __attribute__((target("sse2" LIST(CKZ_FEATURE_STRING_))))
#define CKZ_TARGET_V2 CKZ_TARGET_(CKZ_FEATURES_V2)
#define CKZ_TARGET_V3 CKZ_TARGET_(CKZ_FEATURES_V3)
#define CKZ_TARGET_V4 CKZ_TARGET_(CKZ_FEATURES_V4)
#define CKZ_TARGET_VBMI2 CKZ_TARGET_(CKZ_FEATURES_VBMI2)
/* always-inline helpers of the kernels of a level (a caller of a higher level may inline them) */
#define CKZ_INLINE_V3 CKZ_TARGET_V3 CKZ_INLINE
#define CKZ_INLINE_V4 CKZ_TARGET_V4 CKZ_INLINE
#define CKZ_INLINE_VBMI2 CKZ_TARGET_VBMI2 CKZ_INLINE
#else
#define CKZ_DISPATCH 0
#endif

/* CKZ_VERSIONED(name, params, args) defines `name` calling the always-inline `name##_impl`
 * through the best variant: compiled for the baseline and for CKZ_LEVEL_V3 (256-bit vectors,
 * flag-free variable shifts).  Without dispatch there is one variant. */
#if CKZ_DISPATCH
#define CKZ_VERSIONED(name, params, args)                                                      \
    static void name##_base params { name##_impl args; }                                       \
    CKZ_TARGET_V3 static void name##_v3 params { name##_impl args; }                           \
    static void name params {                                                                  \
        if (CKZ_CPU_AT(V3)) name##_v3 args;                                                    \
        else name##_base args;                                                                 \
    }
#else
#define CKZ_VERSIONED(name, params, args)                                                      \
    static void name params { name##_impl args; }
#endif

/* CKZ_VERSIONED_RETURNING(type, name, params, args): the same for a `name##_impl` that returns
 * a `type`.  The element-wise float kernels use it: compiled for CKZ_LEVEL_V3 their loops become
 * 256-bit vectors (floor and sqrt as single instructions); their arithmetic is IEEE's either
 * way (no fused multiply-adds: -std=c11 keeps contraction off), so every variant gives the
 * same bits. */
#if CKZ_DISPATCH
#define CKZ_VERSIONED_RETURNING(type, name, params, args)                                      \
    static type name##_base params { return name##_impl args; }                                \
    CKZ_TARGET_V3 static type name##_v3 params { return name##_impl args; }                    \
    static type name params { return CKZ_CPU_AT(V3) ? name##_v3 args : name##_base args; }
#else
#define CKZ_VERSIONED_RETURNING(type, name, params, args)                                      \
    static type name params { return name##_impl args; }
#endif

#endif /* CKZ_COMMON_H */
