// libFuzzer target: untrusted bytes through the control-plane preamble check
// (actors/src/control_plane_preamble.hpp), the only bytes troupe itself
// parses on a listening control-plane socket before CAF sees the connection.
// Besides "no crash, no leak, no hang": the check accepts exactly the one
// encoding of the job token and nothing else. Built and run by
// build_and_run.sh (ctest actors.fuzz_preamble).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "control_plane_preamble.hpp"

namespace cp = troupe::actors::control_plane;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::uint64_t token = 0x0123456789abcdefull;
  auto bytes = std::as_bytes(std::span(data, size));
  auto expected = cp::encode_preamble(token);
  auto accepted = cp::check_preamble(bytes, token).has_value();
  bool identical = size == expected.size() && std::memcmp(data, expected.data(), size) == 0;
  if (accepted != identical)
    std::abort(); // accepted something that is not the job's preamble, or refused the real one
  if (!accepted && cp::check_preamble(bytes, token).error().message().empty())
    std::abort(); // every refusal says why
  // A token taken from the input: the check must accept its own encoding.
  if (size >= 8) {
    std::uint64_t other = 0;
    std::memcpy(&other, data, 8);
    if (other != 0 && !cp::check_preamble(cp::encode_preamble(other), other))
      std::abort();
  }
  return 0;
}
