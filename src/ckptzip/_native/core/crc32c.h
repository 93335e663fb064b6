/* crc32c.h - CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), chainable:
 * ckz_crc32c(ckz_crc32c(0, a), b) == ckz_crc32c(0, a || b); check value of "123456789" is
 * 0xE3069283.  SSE4.2 crc32 instructions when the CPU has them, slicing-by-8 otherwise. */
#ifndef CKZ_CRC32C_H
#define CKZ_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Builds the tables and picks the implementation by the CPU level (common.h: the crc32
 * instruction from CKZ_LEVEL_V2, folding from CKZ_LEVEL_VBMI2); call once, after ckz_cpu_init,
 * before any thread uses ckz_crc32c. */
void ckz_crc32c_init(void);
uint32_t ckz_crc32c(uint32_t crc, const uint8_t *data, size_t n);

#endif /* CKZ_CRC32C_H */
