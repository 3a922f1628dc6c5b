#pragma once
// CRC32C (Castagnoli), the checksum of checkpoint files. Uses the SSE4.2
// crc32 instruction when the CPU has it, a table otherwise.
#include <cstddef>
#include <cstdint>
#include <span>

namespace troupe {

/// Continues a CRC32C: pass the previous result as `crc` (0 to start).
/// crc32c(0, "123456789") == 0xE3069283.
std::uint32_t crc32c(std::uint32_t crc, std::span<const std::byte> bytes) noexcept;

} // namespace troupe
