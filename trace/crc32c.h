// CRC32C (Castagnoli), as used by iSCSI, ext4 and leveldb. Private to trace/.
// crc32c() uses the SSE4.2 instruction when the CPU has it, otherwise a
// table-driven (slicing-by-8) software version; both give identical results.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tierlab::trace {

// Extends `crc` (0 to start) with `len` bytes.
uint32_t crc32c(uint32_t crc, const void* data, size_t len);

// The two implementations, for tests. crc32c_hw must only be called when
// crc32c_hw_available() is true.
uint32_t crc32c_sw(uint32_t crc, const void* data, size_t len);
uint32_t crc32c_hw(uint32_t crc, const void* data, size_t len);
bool crc32c_hw_available();

}  // namespace tierlab::trace
