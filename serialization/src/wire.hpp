#pragma once
// Private glue between troupe types and the generated Cap'n Proto types.
// Nothing here may be included from a public header.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "schema/troupe.capnp.h"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::detail {

static_assert(std::endian::native == std::endian::little,
              "troupe's wire and file formats are little-endian; so is Cap'n Proto");

/// Largest accepted dimension or stride, in elements.
inline constexpr std::int64_t max_dimension = std::int64_t{1} << 40;
/// Most segments a header frame may have (ours have one; indexes a few).
inline constexpr std::uint64_t max_segments = 64;

struct tensor_limits {
  std::uint64_t max_payload_bytes;
  std::uint32_t max_rank;
};

/// A TensorHeader after validation.
struct tensor_layout {
  dtype type = dtype::float32;
  dims shape;
  dims strides;
  std::uint64_t byte_count = 0;
  device where = device::cpu();
};

/// Checks every field of `header` against `limits` (see troupe.capnp for
/// the rules); reads each list once, so the traversal limit is spent once.
expected<tensor_layout> read_tensor_header(wire::TensorHeader::Reader header,
                                           const tensor_limits& limits);

void write_tensor_header(wire::TensorHeader::Builder header, const tensor_layout& layout);

/// Length of the flat frame starting at `bytes`, from its segment table.
expected<std::size_t> frame_size(std::span<const std::byte> bytes, std::size_t max_bytes);

/// The flat encoding of `builder` (segment table + segments) as words.
std::vector<std::uint64_t> flatten(capnp::MessageBuilder& builder);

/// Runs `read(reader)` over the frame that is exactly `bytes`, with reader
/// limits sized to it: the traversal limit is a small multiple of the
/// frame's words (each field is read once) and nesting is shallow. A
/// misaligned frame is copied into aligned words first (frames are small and
/// bounded by `max_bytes`). Cap'n Proto's exceptions become
/// errc::malformed_message here, at the boundary.
template <class Read>
auto with_frame(std::span<const std::byte> bytes, std::size_t max_bytes, Read&& read)
    -> decltype(read(std::declval<capnp::MessageReader&>())) {
  auto size = frame_size(bytes, max_bytes);
  if (!size)
    return size.error();
  if (*size != bytes.size())
    return make_error(errc::malformed_message,
                      "header frame is {} bytes according to its segment table but {} arrived",
                      *size, bytes.size());
  auto words = bytes.size() / sizeof(capnp::word);
  std::vector<std::uint64_t> aligned_copy;
  auto* first = reinterpret_cast<const capnp::word*>(bytes.data());
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(capnp::word) != 0) {
    aligned_copy.resize(words);
    std::memcpy(aligned_copy.data(), bytes.data(), bytes.size());
    first = reinterpret_cast<const capnp::word*>(aligned_copy.data());
  }
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words * 4 + 64;
  options.nestingLimit = 8;
  try {
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(first, words), options);
    return read(static_cast<capnp::MessageReader&>(reader));
  } catch (const kj::Exception& e) {
    return make_error(errc::malformed_message, "Cap'n Proto rejected the header: {}",
                      e.getDescription().cStr());
  } catch (const usage_error& e) {
    // Validation should make this unreachable; never let it escape decode.
    return make_error(errc::malformed_message, "header describes an invalid tensor: {}",
                      e.what());
  }
}

} // namespace troupe::detail
