/* Private: CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of a full-state
 * checkpoint's files (iSCSI's, ext4's and the safetensors-adjacent tools' choice; part 2 joins
 * ranges with a combine function). */
#ifndef DISTLAB_CORE_CRC32C_H
#define DISTLAB_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of n bytes continuing from crc (start with 0): dl__crc32c(0, "123456789", 9) is
 * 0xE3069283. The SSE4.2 instruction when the CPU has it, a table otherwise (same values). */
uint32_t dl__crc32c(uint32_t crc, const void *p, size_t n);

#endif
