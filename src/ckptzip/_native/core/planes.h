/* planes.h - byte-plane split and merge with a bit rotation per element.
 *
 * An element is elem_size bytes, read as one little-endian (8*elem_size)-bit word.  Split rotates
 * each word LEFT by `rotate` bits, then sends byte p of the rotated word to plane p:
 *     plane[p][i] = byte p of rotl(word_i, rotate)
 * Merge is the exact inverse.  The rotation gathers a float's exponent into one byte: (2,1) for
 * bf16 and fp16, (4,1) for fp32, (8,1) for fp64, (1,1) for fp8 e4m3 (sign to the low bit).
 */
#ifndef CKZ_PLANES_H
#define CKZ_PLANES_H

#include <stddef.h>
#include <stdint.h>

/* Bound on elem_size: the fused plane coder keeps one pointer per plane on the stack and the
 * stream allows at most CKZ_MAX_SEGMENTS segments (stream.h); this must not exceed that. */
#define CKZ_MAX_ELEM_SIZE 64

/* src: n*elem_size bytes; dst: n*elem_size bytes, plane p at dst + p*n.  Callers have checked
 * 1 <= elem_size <= CKZ_MAX_ELEM_SIZE and rotate < 8*elem_size. */
void ckz_split_planes(const uint8_t *src, uint8_t *dst, size_t n, unsigned elem_size,
                      unsigned rotate);

/* planes[p]: n bytes each (they need not be adjacent); dst: n*elem_size bytes. */
void ckz_merge_planes(const uint8_t *const *planes, uint8_t *dst, size_t n, unsigned elem_size,
                      unsigned rotate);

#endif /* CKZ_PLANES_H */
