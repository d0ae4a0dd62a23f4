/*
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord and TensorBoard event
 * files use it, and their "masked" form that protects a CRC stored next to the data it
 * covers. A byte-wise table: event files are small, speed does not matter here.
 */
#ifndef TS_CRC32C_H
#define TS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over data[0..n). ts_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ts_crc32c(uint32_t crc, const void *data, size_t n);

/* TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t ts_crc32c_mask(uint32_t crc);

#endif
