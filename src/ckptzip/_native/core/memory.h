/* memory.h - memory that does not cost a page fault per 4 KiB.
 *
 * On a VM a first touch of a fresh 4 KiB page costs microseconds (measured here: 43 MB written
 * into fresh memory took 35 ms, into reused memory 5 ms), which is as long as coding the bytes.
 * Two remedies:
 *  - per-thread scratch buffers that live from call to call, so that the planes and streams of
 *    every chunk reuse warm memory instead of a fresh malloc (glibc returns freed blocks of a few
 *    hundred KiB to the kernel, so each chunk faulted its scratch in again);
 *  - large buffers that are handed out (decoded tensors, a dumps() result) mapped with
 *    transparent huge pages advised on their 2 MiB-aligned body: one fault per 2 MiB.
 */
#ifndef CKZ_MEMORY_H
#define CKZ_MEMORY_H

#include <stddef.h>
#include <stdint.h>

/* Scratch slots: one per nesting level of the calls that take scratch. */
enum { CKZ_SCRATCH_OUTPUT, CKZ_SCRATCH_PLANES, CKZ_SCRATCH_STREAMS, CKZ_SCRATCH_DECODE,
       CKZ_SCRATCH_SLOTS };
/* Larger requests are malloc'd and freed each time: a thread keeps at most this per slot. */
#define CKZ_SCRATCH_KEEP ((size_t)32 << 20)

/* n bytes (uninitialized) of this thread's scratch slot, or NULL when out of memory.  Valid until
 * the same thread takes the slot again; give it back with ckz_scratch_put. */
uint8_t *ckz_scratch_get(unsigned slot, size_t n);
void ckz_scratch_put(unsigned slot, uint8_t *p);

/* Advises transparent huge pages for the 2 MiB-aligned pages inside [p, p + n), before they are
 * first touched (Linux; elsewhere nothing).  Harmless on memory that is already mapped in. */
void ckz_advise_huge(void *p, size_t n);

/* An anonymous mapping of n >= 1 bytes whose 2 MiB-aligned body is advised huge pages: the
 * mapping starts on a 2 MiB boundary, so a buffer of m MiB takes floor(m / 2) huge pages and
 * small pages for the rest (no memory beyond n, rounded to the page, is used).  NULL when the
 * mapping fails; free with ckz_pages_free(p, n). */
void *ckz_pages_alloc(size_t n);
void ckz_pages_free(void *p, size_t n);

#endif /* CKZ_MEMORY_H */
