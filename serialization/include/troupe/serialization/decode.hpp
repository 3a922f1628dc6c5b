#pragma once
// Validating, zero-copy decoding of data-plane messages (encoded_message.hpp
// describes the wire shape).
//
// Nothing from the wire is trusted: every count is checked against limits
// and against the bytes actually received before anything is allocated, the
// Cap'n Proto traversal limit is sized per message, and every failure is an
// error value (troupe::error) — decode never throws, crashes or hangs.
//
// Alignment: Cap'n Proto reads 8-byte aligned words. A header frame at a
// misaligned address is copied into an aligned buffer (it is small, at most
// `max_header_bytes`); the payload is never copied, so a payload that is not
// aligned to its element size is an error (errc::malformed_message).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "troupe/serialization/fwd.hpp"
#include "troupe/serialization/message_meta.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

/// Limits a receiver applies to untrusted messages.
struct decode_options {
  /// Largest accepted payload (byteCount) and logical tensor size.
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 30;
  /// Largest accepted header frame; also bounds the Cap'n Proto traversal.
  std::size_t max_header_bytes = 64 * 1024;
  /// Largest accepted tensor rank.
  std::uint32_t max_rank = 16;
};

/// A validated header: what the receiver needs to allocate the payload.
struct message_header {
  message_meta meta;
  dtype type = dtype::float32;
  dims shape;
  /// In elements, relative to the first payload byte.
  dims strides;
  /// Exact payload size the sender announced (already checked against the
  /// shape, strides and limits).
  std::uint64_t byte_count = 0;
  /// Where the sender's tensor lived.
  device sender_device = device::cpu();
};

/// A decoded message; `value` aliases the received payload buffer.
struct decoded_message {
  message_meta meta;
  tensor value;
  device sender_device = device::cpu();
};

/// Length of the header frame that starts `bytes`, read from its segment
/// table (needs the first 8 bytes, and the whole table when there is more
/// than one segment). For stream transports: read this many bytes, then the
/// payload.
expected<std::size_t> header_frame_size(std::span<const std::byte> bytes,
                                        const decode_options& options = {});

/// Parses and validates a header frame (exactly one frame, no payload).
expected<message_header> decode_header(std::span<const std::byte> header,
                                       const decode_options& options = {});

/// Decodes a header frame plus a separately received payload (the UCX path:
/// AM header + data received into `payload`). `payload->bytes()` must equal
/// the announced byteCount; the tensor aliases `payload`.
expected<decoded_message> decode(std::span<const std::byte> header,
                                 std::shared_ptr<storage> payload,
                                 const decode_options& options = {});

/// Decodes one flat frame (header frame followed by the payload, as
/// to_flat_bytes() writes and a socket delivers). The tensor aliases the
/// payload bytes inside `frame`; `owner` is kept alive by the tensor's
/// storage for as long as any view of it exists (may be null when the caller
/// guarantees the frame outlives the tensor). The tensor is writable: the
/// receive buffer must be the receiver's to modify.
expected<decoded_message> decode_flat(std::span<const std::byte> frame,
                                      std::shared_ptr<const void> owner,
                                      const decode_options& options = {});

/// decode_flat() over a whole storage block (a pooled receive buffer); the
/// tensor views a window of `frame` and keeps it alive.
expected<decoded_message> decode_flat(std::shared_ptr<storage> frame,
                                      const decode_options& options = {});

} // namespace troupe
