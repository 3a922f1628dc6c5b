#pragma once
// The first bytes of every control-plane connection: proof that the
// connecting process belongs to the job, checked by the listening node
// before a single byte reaches CAF's BASP broker (docs/design.md, "A stray
// connection never reaches BASP"). With TLS it travels inside the session,
// after the certificate check.
//
//   offset  size  field
//        0     8  magic "TROUPEcp"
//        8     2  version (1), little endian
//       10     2  reserved, 0
//       12     4  reserved, 0
//       16     8  the job token, little endian, never 0
//       24     8  reserved, 0
//
// Fixed size, so the listener reads exactly these bytes and leaves the
// client's first BASP bytes in the socket for CAF.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "troupe/tensor/expected.hpp"

namespace troupe::actors::control_plane {

inline constexpr std::size_t preamble_size = 32;
inline constexpr std::uint16_t preamble_version = 1;

std::array<std::byte, preamble_size> encode_preamble(std::uint64_t token);

/// Checks the magic of the first bytes received (at least 8), so that a
/// stranger is refused before it has sent all 32.
troupe::expected<void> check_preamble_start(std::span<const std::byte> first);

/// Checks a received preamble against this job's token. The error names the
/// first thing wrong: its length, the magic, the version, a reserved field,
/// a missing or a wrong token (never the expected token itself).
troupe::expected<void> check_preamble(std::span<const std::byte> bytes, std::uint64_t token);

} // namespace troupe::actors::control_plane
