// Writing and checking the data plane's frames (data_plane_wire.hpp). Every
// check reads a fixed header only after the frame was found long enough for
// it, and reads a name or header after it only once its size was checked
// against the frame.
#include "data_plane_wire.hpp"

#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace troupe::actors::detail {

namespace {

/// A fixed header followed by the bytes of each tail, in order.
template <class Header>
std::vector<std::byte> frame_of(const Header& h, std::span<const std::byte> first = {},
                                std::span<const std::byte> second = {}) {
  std::vector<std::byte> frame(sizeof h + first.size() + second.size());
  std::memcpy(frame.data(), &h, sizeof h);
  if (!first.empty())
    std::memcpy(frame.data() + sizeof h, first.data(), first.size());
  if (!second.empty())
    std::memcpy(frame.data() + sizeof h + first.size(), second.data(), second.size());
  return frame;
}

std::span<const std::byte> bytes_of(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

/// The fixed header at the start of `frame` (whose size the caller checked).
template <class Header> Header header_of(std::span<const std::byte> frame) {
  Header h{};
  std::memcpy(&h, frame.data(), sizeof h);
  return h;
}

std::string_view name_after(const auto& h, std::span<const std::byte> frame) {
  return {reinterpret_cast<const char*>(frame.data()) + sizeof h, h.name_bytes};
}

std::optional<frame_rejection> check_token(std::uint64_t carried, std::uint64_t token,
                                           std::string_view what) {
  if (carried == token)
    return std::nullopt;
  return frame_rejection{&data_plane_stats::dropped_bad_token,
                         fmt::format("{} carries {}", what,
                                     carried == 0 ? "no job token" : "a wrong job token")};
}

frame_rejection malformed(std::string reason) {
  return {&data_plane_stats::dropped_malformed, std::move(reason)};
}

/// The Cap'n Proto header of a data or arena frame, and its token.
std::variant<message_header, frame_rejection>
read_message_header(std::span<const std::byte> header, std::uint64_t token,
                    const decode_options& options) {
  auto parsed = decode_header(header, options);
  if (!parsed)
    return frame_rejection{parsed.error().code() == errc::size_limit_exceeded
                               ? &data_plane_stats::dropped_oversized
                               : &data_plane_stats::dropped_malformed,
                           parsed.error().to_string()};
  if (auto bad = check_token(parsed->meta.token, token, "frame"))
    return std::move(*bad);
  return std::move(*parsed);
}

} // namespace

std::vector<std::byte> write_hello(std::uint64_t token, peer_id sender,
                                   std::string_view node_name) {
  return frame_of(hello_header{data_plane_wire::magic, token, sender,
                               static_cast<std::uint32_t>(node_name.size()), 0},
                  bytes_of(node_name));
}

std::vector<std::byte> write_ack(std::uint64_t peer, std::uint64_t bytes, std::uint64_t messages) {
  return frame_of(ack_header{peer, bytes, messages});
}

std::vector<std::byte> write_goodbye(std::uint64_t token, peer_id sender) {
  return frame_of(goodbye_header{data_plane_wire::magic, token, sender});
}

expected<std::vector<std::byte>> write_arena_frame(const arena_ref& region,
                                                   std::span<const std::byte> header) {
  if (header.size() > data_plane_wire::max_arena_header_bytes)
    return make_error(errc::size_limit_exceeded, "data plane: arena frame header of {} bytes",
                      header.size());
  return frame_of(arena_header{data_plane_wire::magic, region.offset, region.length,
                               static_cast<std::uint32_t>(region.arena.size()),
                               static_cast<std::uint32_t>(header.size())},
                  bytes_of(region.arena), header);
}

std::vector<std::byte> write_release(std::uint64_t token, const arena_ref& region) {
  return frame_of(release_header{data_plane_wire::magic, token, region.offset, region.length,
                                 static_cast<std::uint32_t>(region.arena.size()), 0},
                  bytes_of(region.arena));
}

std::variant<hello_frame, frame_rejection> read_hello(std::span<const std::byte> frame,
                                                      std::uint64_t token) {
  if (frame.size() < sizeof(hello_header))
    return malformed("hello is too short or anonymous");
  auto h = header_of<hello_header>(frame);
  if (h.magic != data_plane_wire::magic || h.name_bytes != frame.size() - sizeof h ||
      h.name_bytes == 0 || h.name_bytes > data_plane_wire::max_name_bytes)
    return malformed(fmt::format("hello is malformed (magic {:#x}, name of {} bytes in {})",
                                 h.magic, h.name_bytes, frame.size()));
  if (auto bad = check_token(h.token, token, "hello"))
    return std::move(*bad);
  return hello_frame{std::string(name_after(h, frame)), h.sender_peer};
}

std::optional<ack_header> read_ack(std::span<const std::byte> frame) {
  if (frame.size() != sizeof(ack_header))
    return std::nullopt;
  return header_of<ack_header>(frame);
}

bool is_goodbye(std::span<const std::byte> frame, std::uint64_t token) {
  if (frame.size() != sizeof(goodbye_header))
    return false;
  auto g = header_of<goodbye_header>(frame);
  return g.magic == data_plane_wire::magic && g.token == token;
}

std::optional<frame_rejection> check_data_frame(std::span<const std::byte> header,
                                                std::size_t data_bytes, std::uint64_t token,
                                                const decode_options& options) {
  auto parsed = read_message_header(header, token, options);
  if (auto* bad = std::get_if<frame_rejection>(&parsed))
    return std::move(*bad);
  auto byte_count = std::get<message_header>(parsed).byte_count;
  if (data_bytes != byte_count)
    return malformed(fmt::format("payload is {} bytes but the header's byteCount is {}",
                                 data_bytes, byte_count));
  return std::nullopt;
}

std::variant<arena_frame, frame_rejection> read_arena_frame(std::span<const std::byte> frame,
                                                            std::size_t data_bytes,
                                                            std::uint64_t token,
                                                            const decode_options& options) {
  if (frame.size() < sizeof(arena_header))
    return malformed(fmt::format("is {} bytes but must be at least {}", frame.size(),
                                 sizeof(arena_header)));
  auto h = header_of<arena_header>(frame);
  if (h.magic != data_plane_wire::magic || data_bytes != 0 || h.name_bytes == 0 ||
      h.name_bytes > data_plane_wire::max_arena_name_bytes || h.header_bytes == 0 ||
      h.header_bytes > data_plane_wire::max_arena_header_bytes ||
      std::uint64_t{h.name_bytes} + h.header_bytes != frame.size() - sizeof h)
    return malformed(fmt::format("malformed (magic {:#x}, name {} bytes in [1, {}], header {} "
                                 "bytes in [1, {}], frame {} bytes, data {} bytes)",
                                 h.magic, h.name_bytes, data_plane_wire::max_arena_name_bytes,
                                 h.header_bytes, data_plane_wire::max_arena_header_bytes,
                                 frame.size(), data_bytes));
  arena_frame out;
  auto& handoff = out.handoff;
  handoff.region.arena = name_after(h, frame);
  handoff.region.offset = h.offset;
  handoff.region.length = h.length;
  auto header = frame.subspan(sizeof h + h.name_bytes);
  handoff.header.assign(header.begin(), header.end());
  auto parsed = read_message_header(handoff.header, token, options);
  if (auto* bad = std::get_if<frame_rejection>(&parsed))
    return std::move(*bad);
  auto& meta = std::get<message_header>(parsed);
  if (meta.byte_count != h.length)
    return malformed(fmt::format("region is {} bytes but the header's byteCount is {}", h.length,
                                 meta.byte_count));
  out.flow_id = meta.meta.flow_id;
  return out;
}

std::variant<arena_ref, frame_rejection> read_release(std::span<const std::byte> frame,
                                                      std::uint64_t token) {
  if (frame.size() < sizeof(release_header))
    return malformed("release is too short");
  auto r = header_of<release_header>(frame);
  if (r.magic != data_plane_wire::magic || r.name_bytes == 0 ||
      r.name_bytes > data_plane_wire::max_arena_name_bytes ||
      r.name_bytes != frame.size() - sizeof r)
    return malformed(fmt::format("release is malformed (magic {:#x}, name of {} bytes in {})",
                                 r.magic, r.name_bytes, frame.size()));
  if (auto bad = check_token(r.token, token, "release"))
    return std::move(*bad);
  return arena_ref{std::string(name_after(r, frame)), r.offset, r.length};
}

} // namespace troupe::actors::detail
