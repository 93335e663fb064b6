/* memory.c - per-thread scratch and huge-page buffers (memory.h says why). */
#define _GNU_SOURCE
#include "memory.h"

#include <stdlib.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CKZ_NO_SCRATCH_CACHE 1 /* let ASan see every scratch buffer's exact bounds */
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(_WIN32)
#define CKZ_NO_SCRATCH_CACHE 1
#endif

#ifndef CKZ_NO_SCRATCH_CACHE
#include <pthread.h>

typedef struct {
    uint8_t *p[CKZ_SCRATCH_SLOTS];
    size_t cap[CKZ_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_free(void *arg) { /* at thread exit */
    scratch_set *set = arg;
    for (unsigned s = 0; s < CKZ_SCRATCH_SLOTS; s++) free(set->p[s]);
    free(set);
}

static void scratch_key_init(void) {
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}

static scratch_set *this_thread(void) {
    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok) return NULL;
    scratch_set *set = pthread_getspecific(scratch_key);
    if (!set) {
        set = calloc(1, sizeof *set);
        if (set && pthread_setspecific(scratch_key, set)) {
            free(set);
            set = NULL;
        }
    }
    return set;
}
#endif

uint8_t *ckz_scratch_get(unsigned slot, size_t n) {
    if (!n) n = 1;
#ifndef CKZ_NO_SCRATCH_CACHE
    scratch_set *set = n <= CKZ_SCRATCH_KEEP && slot < CKZ_SCRATCH_SLOTS ? this_thread() : NULL;
    if (set) {
        if (set->cap[slot] < n) {
            free(set->p[slot]);
            set->p[slot] = malloc(n);
            set->cap[slot] = set->p[slot] ? n : 0;
        }
        return set->p[slot];
    }
#else
    (void)slot;
#endif
    return malloc(n);
}

void ckz_scratch_put(unsigned slot, uint8_t *p) {
#ifndef CKZ_NO_SCRATCH_CACHE
    scratch_set *set = slot < CKZ_SCRATCH_SLOTS ? this_thread() : NULL;
    if (set && p == set->p[slot]) return;
#else
    (void)slot;
#endif
    free(p);
}

#define HUGE_PAGE ((uintptr_t)2 << 20)

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>

void ckz_advise_huge(void *p, size_t n) {
    uintptr_t start = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t end = ((uintptr_t)p + n) & ~(HUGE_PAGE - 1);
    if (end > start) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
}

void *ckz_pages_alloc(size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (n + page - 1) / page * page;
    if (len < HUGE_PAGE) { /* no huge page fits: a plain mapping */
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    /* Map HUGE_PAGE more, then unmap the head and tail around the aligned start. */
    size_t span = len + HUGE_PAGE;
    uint8_t *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + span > p + len) munmap(p + len, (size_t)(raw + span - (p + len)));
    ckz_advise_huge(p, len);
    return p;
}

void ckz_pages_free(void *p, size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (p) munmap(p, (n + page - 1) / page * page);
}
#else
void ckz_advise_huge(void *p, size_t n) { (void)p; (void)n; }
void *ckz_pages_alloc(size_t n) { return malloc(n ? n : 1); }
void ckz_pages_free(void *p, size_t n) { (void)n; free(p); }
#endif
