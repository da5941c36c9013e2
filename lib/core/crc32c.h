/* Private: CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of a full-state
 * checkpoint's files (iSCSI's, ext4's and the safetensors-adjacent tools' choice; part 2 joins
 * ranges with the combine function). */
#ifndef DISTLAB_CORE_CRC32C_H
#define DISTLAB_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of n bytes continuing from crc (start with 0): dl__crc32c(0, "123456789", 9) is
 * 0xE3069283. The SSE4.2 instruction when the CPU has it, a table otherwise (same values). */
uint32_t dl__crc32c(uint32_t crc, const void *p, size_t n);

/* The CRC32C of A followed by B from crc_a = CRC(A), crc_b = CRC(B) and B's length: with the
 * initial and final inversions, CRC(A B) = CRC(A)·x^(8|B|) ⊕ CRC(B) modulo the generator, so
 * the CRC of a concatenation of pieces S_0 .. S_k is the XOR over i of
 * dl__crc32c_shift(CRC(S_i), bytes after S_i): pieces held by different ranks combine in any
 * order once each knows its offset from the end (the checkpoints' state hash, io/ckdir_hash.c). */
uint32_t dl__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* crc·x^(8 n) modulo the generator: the contribution of a piece with n bytes after it. */
uint32_t dl__crc32c_shift(uint32_t crc, uint64_t n);

#endif
