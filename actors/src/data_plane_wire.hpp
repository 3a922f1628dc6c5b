#pragma once
// The data plane's frames as bytes: the fixed headers of the hello, ack,
// goodbye, arena and release active messages, how each is written, and how
// an arriving one is checked before anything in it is trusted (the AM ids
// and limits are public: data_plane_wire in data_plane.hpp). Kept apart
// from the transport so that a frame's layout and its checks read in one
// place, and every check here is a function of the bytes and the job token
// alone; which peer sent a frame is the transport's question
// (data_plane_receive.cpp).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "troupe/actors/data_plane.hpp"
#include "troupe/serialization/decode.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors::detail {

struct hello_header {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t sender_peer; // the sender's id for this link; echoed in acks
  std::uint32_t name_bytes;
  std::uint32_t reserved;
};

struct ack_header {
  std::uint64_t peer; // the data sender's id for this link
  std::uint64_t bytes;
  std::uint64_t messages;
};

struct goodbye_header {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t sender_peer;
};

/// Followed by the arena's name and the Cap'n Proto header frame.
struct arena_header {
  std::uint64_t magic;
  std::uint64_t offset;
  std::uint64_t length;
  std::uint32_t name_bytes;
  std::uint32_t header_bytes;
};

/// Followed by the arena's name.
struct release_header {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t offset;
  std::uint64_t length;
  std::uint32_t name_bytes;
  std::uint32_t reserved;
};

// -- writing ------------------------------------------------------------------

/// Each frame is its fixed header, then the names and header frames it
/// announces, in that order.
std::vector<std::byte> write_hello(std::uint64_t token, peer_id sender,
                                   std::string_view node_name);
std::vector<std::byte> write_ack(std::uint64_t peer, std::uint64_t bytes, std::uint64_t messages);
std::vector<std::byte> write_goodbye(std::uint64_t token, peer_id sender);
/// The arena frame for `region`, carrying the tensor's Cap'n Proto `header`
/// (token inside); errc::size_limit_exceeded for a header above
/// data_plane_wire::max_arena_header_bytes.
expected<std::vector<std::byte>> write_arena_frame(const arena_ref& region,
                                                   std::span<const std::byte> header);
std::vector<std::byte> write_release(std::uint64_t token, const arena_ref& region);

// -- checking what arrives ----------------------------------------------------

/// The counter in data_plane_stats that a dropped frame counts under
/// (dropped_malformed, dropped_oversized, dropped_bad_token, ...).
using drop_counter = std::uint64_t data_plane_stats::*;

/// Why an arriving frame is dropped: its counter, and the reason to log.
struct frame_rejection {
  drop_counter counter;
  std::string reason;
};

struct hello_frame {
  std::string name;
  std::uint64_t sender_peer = 0;
};

struct arena_frame {
  arena_handoff handoff;
  std::uint64_t flow_id = 0;
};

/// A hello: magic, a name of [1, max_name_bytes] that fills the rest of the
/// frame, then the token.
std::variant<hello_frame, frame_rejection> read_hello(std::span<const std::byte> frame,
                                                      std::uint64_t token);
/// An ack of the exact size, or nothing (a malformed ack is ignored).
std::optional<ack_header> read_ack(std::span<const std::byte> frame);
/// Whether `frame` is a goodbye of the exact size with this job's token.
bool is_goodbye(std::span<const std::byte> frame, std::uint64_t token);
/// A data frame: its Cap'n Proto header and token, and a payload of
/// `data_bytes` that is the header's byteCount.
std::optional<frame_rejection> check_data_frame(std::span<const std::byte> header,
                                                std::size_t data_bytes, std::uint64_t token,
                                                const decode_options& options);
/// An arena frame: every size in it is checked against the frame before
/// anything is read, then the Cap'n Proto header and the token like a data
/// frame's, and the region's length against the header's byteCount. The
/// region itself is on_arena's to validate against the mapping
/// (arena_mapper::open). Reasons lack the "arena frame: " prefix.
std::variant<arena_frame, frame_rejection> read_arena_frame(std::span<const std::byte> frame,
                                                            std::size_t data_bytes,
                                                            std::uint64_t token,
                                                            const decode_options& options);
/// A release: magic, a name of [1, max_arena_name_bytes] that fills the
/// rest of the frame, then the token.
std::variant<arena_ref, frame_rejection> read_release(std::span<const std::byte> frame,
                                                      std::uint64_t token);

} // namespace troupe::actors::detail
