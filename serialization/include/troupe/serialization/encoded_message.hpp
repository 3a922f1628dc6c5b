#pragma once
// Zero-copy encoding of one tensor message for the data plane.
//
// Wire shape (why two parts): a message is a small Cap'n Proto *header
// frame* (standard flat encoding: segment table + segments; it carries the
// message_meta and the tensor's dtype, shape, strides and byte count) plus
// the *payload*, the tensor's bytes, kept apart from it. This is exactly what
// UCP active messages want (docs/design.md): the header frame is the AM header,
// the payload an iov straight from tensor memory, and the receiver validates
// the header and picks a buffer before a single payload byte arrives. We do
// not use Orphanage::referenceExternalData to make the payload a Cap'n Proto
// segment: segments must be whole, 8-byte aligned words, which a uint8
// tensor of odd length or a view at an odd offset is not, and a receiver
// would then need the full message before it could validate anything.
//
// For files, tests and plain sockets, `to_flat_bytes()` concatenates the two
// (header frame, then payload); the frame is a multiple of 8 bytes, so the
// payload of an 8-aligned buffer is 8-aligned. decode.hpp reads both forms.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/serialization/fwd.hpp"
#include "troupe/serialization/message_meta.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

/// An encoded message: owns its header frame and keeps the tensor whose
/// memory the payload points at alive for as long as it exists.
class encoded_message {
public:
  /// The Cap'n Proto header frame (segment table included), 8-byte aligned
  /// and a multiple of 8 bytes long.
  std::span<const std::byte> header_bytes() const noexcept {
    return std::as_bytes(std::span<const std::uint64_t>(header_words_));
  }

  /// The tensor's bytes, pointing at the tensor's own memory (no copy).
  /// For a CUDA tensor this is device memory.
  std::span<const std::byte> payload() const noexcept {
    return {static_cast<const std::byte*>(payload_.raw_data()), payload_bytes_};
  }

  /// The tensor the payload belongs to: the caller's tensor, or its
  /// contiguous() copy when the caller's layout had gaps (see encode()).
  const tensor& payload_tensor() const noexcept { return payload_; }

  /// header_bytes().size() + payload().size().
  std::size_t size() const noexcept { return header_bytes().size() + payload_bytes_; }

  /// Header frame followed by the payload in one buffer (copies the payload;
  /// for files, tests and stream sockets, not the UCX path). CPU tensors only.
  std::vector<std::byte> to_flat_bytes() const;

private:
  friend encoded_message encode(const message_meta& meta, const tensor& value);

  std::vector<std::uint64_t> header_words_;
  tensor payload_;
  std::size_t payload_bytes_ = 0;
};

/// Encodes `value` with `meta` without copying the tensor's bytes.
///
/// Layout policy: a contiguous tensor is sent as-is. A strided view whose
/// elements cover a dense block no larger than its own size (transposes,
/// permutes, broadcasts) is also sent as-is, strides included, so the
/// receiver gets the same view of the same bytes. A view with gaps (narrow,
/// slice with a step, select) would ship bytes nobody asked for, so it is
/// encoded from `value.contiguous()`: one copy, made here, on the sender.
///
/// Throws usage_error for an undefined tensor (tier 2: a bug in the caller).
encoded_message encode(const message_meta& meta, const tensor& value);

} // namespace troupe
