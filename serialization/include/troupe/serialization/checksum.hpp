#pragma once
// CRC32C (Castagnoli), the checksum of checkpoint files, computed by ISA-L
// (libisal), which picks its fastest loop for the CPU at run time.
#include <cstddef>
#include <cstdint>
#include <span>

namespace troupe {

/// Continues a CRC32C: pass the previous result as `crc` (0 to start).
/// crc32c(0, "123456789") == 0xE3069283.
std::uint32_t crc32c(std::uint32_t crc, std::span<const std::byte> bytes) noexcept;

/// The CRC32C of A followed by B from crc32c(0, A), crc32c(0, B) and B's
/// length, without reading the bytes again (a file's checksum from its
/// pieces' checksums).
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b) noexcept;

} // namespace troupe
