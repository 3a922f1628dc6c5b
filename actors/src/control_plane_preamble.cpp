#include "control_plane_preamble.hpp"

#include <cstring>

namespace troupe::actors::control_plane {

namespace {

constexpr char magic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'c', 'p'};

void put_le(std::byte* out, std::uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i)
    out[i] = static_cast<std::byte>(value >> (8 * i));
}

std::uint64_t get_le(const std::byte* in, std::size_t bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < bytes; ++i)
    value |= std::uint64_t{std::to_integer<std::uint8_t>(in[i])} << (8 * i);
  return value;
}

} // namespace

std::array<std::byte, preamble_size> encode_preamble(std::uint64_t token) {
  std::array<std::byte, preamble_size> out{};
  std::memcpy(out.data(), magic, sizeof magic);
  put_le(out.data() + 8, preamble_version, 2);
  put_le(out.data() + 16, token, 8);
  return out;
}

troupe::expected<void> check_preamble_start(std::span<const std::byte> first) {
  if (first.size() < sizeof magic || std::memcmp(first.data(), magic, sizeof magic) != 0)
    return make_error(errc::malformed_message, "no troupe preamble (the first 8 bytes are not \"TROUPEcp\")");
  return {};
}

troupe::expected<void> check_preamble(std::span<const std::byte> bytes, std::uint64_t token) {
  if (bytes.size() != preamble_size)
    return make_error(errc::malformed_message, "the preamble has {} bytes, not {}", bytes.size(), preamble_size);
  if (auto ok = check_preamble_start(bytes); !ok)
    return ok;
  if (auto version = get_le(bytes.data() + 8, 2); version != preamble_version)
    return make_error(errc::malformed_message, "preamble version {} (this node speaks {})", version,
                      preamble_version);
  if (get_le(bytes.data() + 10, 2) != 0 || get_le(bytes.data() + 12, 4) != 0 || get_le(bytes.data() + 24, 8) != 0)
    return make_error(errc::malformed_message, "the preamble's reserved fields are not 0");
  auto received = get_le(bytes.data() + 16, 8);
  if (received == 0)
    return make_error(errc::malformed_message, "the preamble carries no job token");
  if (received != token)
    return make_error(errc::malformed_message, "the preamble carries a wrong job token (another job's, or a guess)");
  return {};
}

} // namespace troupe::actors::control_plane
