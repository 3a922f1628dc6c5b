// libFuzzer target: untrusted bytes through every decoder (a data-plane flat
// frame, a checkpoint file image and a distributed checkpoint's manifest). Any crash, leak, hang or escaping
// exception is a bug. Built and run by build_and_run.sh (ctest
// serialization.fuzz).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "troupe/serialization/checkpoint_file.hpp"
#include "troupe/serialization/checkpoint_manifest.hpp"
#include "troupe/serialization/decode.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Aligned copy, as a receive buffer would be; also try the misaligned
  // original for the header-copy path.
  std::vector<std::uint64_t> words((size + 7) / 8);
  if (size > 0)
    std::memcpy(words.data(), data, size);
  auto aligned = std::as_bytes(std::span(words)).first(size);
  auto raw = std::as_bytes(std::span(data, size));

  troupe::decode_options small;
  small.max_payload_bytes = 1 << 20;
  if (auto message = troupe::decode_flat(aligned, nullptr, small)) {
    // Touch every addressed element: aliasing must stay inside the frame.
    volatile double sink = 0;
    if (message->value.numel() > 0 && message->value.numel() < 4096)
      for (auto x : message->value.to_vector<double>())
        sink = sink + x;
  }
  (void)troupe::decode_header(raw, small);
  (void)troupe::decode_flat(raw, nullptr, small);

  troupe::checkpoint_options limits;
  limits.max_tensor_bytes = 1 << 20;
  if (auto checkpoint = troupe::parse_checkpoint(raw, limits)) {
    volatile double sink = 0;
    for (const auto& [name, value] : checkpoint->tensors)
      if (value.numel() > 0 && value.numel() < 4096)
        for (auto x : value.to_vector<double>())
          sink = sink + x;
  }

  troupe::manifest_options manifest_limits;
  manifest_limits.max_manifest_bytes = 1 << 20;
  manifest_limits.max_pieces = 64;
  (void)troupe::parse_manifest(raw, manifest_limits);
  return 0;
}
