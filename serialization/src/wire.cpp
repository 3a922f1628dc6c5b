#include "wire.hpp"

#include <limits>

#include <fmt/ranges.h>

namespace troupe::detail {

namespace {

std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

} // namespace

expected<tensor_layout> read_tensor_header(wire::TensorHeader::Reader header,
                                           const tensor_limits& limits) {
  tensor_layout out;
  auto raw_dtype = header.getDtype();
  auto type = dtype_from_wire(raw_dtype);
  if (!type)
    return make_error(errc::unsupported_dtype, "dtype {} is unknown (wire values are [0, {}))",
                      raw_dtype, dtype_count);
  out.type = *type;
  auto element = static_cast<std::uint64_t>(size_of(out.type));

  auto shape = header.getShape();
  if (shape.size() > limits.max_rank)
    return make_error(errc::size_limit_exceeded, "rank {} is above the limit {}", shape.size(),
                      limits.max_rank);
  out.shape.reserve(shape.size());
  for (unsigned d = 0; d < shape.size(); ++d) {
    auto size = shape[d];
    if (size < 0 || size > max_dimension)
      return make_error(errc::malformed_message, "dimension {} is {} but must be in [0, 2^40]", d,
                        size);
    out.shape.push_back(size);
  }
  auto strides = header.getStrides();
  if (strides.size() != shape.size())
    return make_error(errc::malformed_message, "strides has {} entries but shape {} has rank {}",
                      strides.size(), out.shape, out.shape.size());
  out.strides.reserve(strides.size());
  for (unsigned d = 0; d < strides.size(); ++d) {
    auto stride = strides[d];
    if (stride < 0 || stride > max_dimension)
      return make_error(errc::malformed_message, "stride {} is {} but must be in [0, 2^40]", d,
                        stride);
    out.strides.push_back(stride);
  }

  // Logical size: bounded too, so a broadcast view (stride 0) cannot make a
  // receiver that later calls contiguous() allocate without limit.
  bool empty = false;
  for (auto size : out.shape)
    empty = empty || size == 0;
  std::uint64_t logical_bytes = 0;
  std::uint64_t extent_bytes = 0;
  if (!empty) {
    std::uint64_t count = 1;
    bool overflow = false;
    for (auto size : out.shape)
      overflow = overflow || __builtin_mul_overflow(count, static_cast<std::uint64_t>(size), &count);
    overflow = overflow || __builtin_mul_overflow(count, element, &logical_bytes);
    if (overflow || logical_bytes > limits.max_payload_bytes)
      return make_error(errc::size_limit_exceeded,
                        "shape {} of {} holds more than the limit of {} bytes", out.shape,
                        out.type, limits.max_payload_bytes);
    // Index of the last addressed element; each term is below 2^80, the sum
    // of at most max_rank terms fits in 128 bits.
    unsigned __int128 last = 0;
    for (std::size_t d = 0; d < out.shape.size(); ++d)
      last += static_cast<unsigned __int128>(out.shape[d] - 1) *
              static_cast<unsigned __int128>(out.strides[d]);
    auto extent = (last + 1) * element;
    if (extent > limits.max_payload_bytes)
      return make_error(errc::size_limit_exceeded,
                        "shape {} with strides {} of {} addresses more than the limit of {} bytes",
                        out.shape, out.strides, out.type, limits.max_payload_bytes);
    extent_bytes = static_cast<std::uint64_t>(extent);
  }

  out.byte_count = header.getByteCount();
  if (out.byte_count > limits.max_payload_bytes)
    return make_error(errc::size_limit_exceeded, "byteCount {} is above the limit {}",
                      out.byte_count, limits.max_payload_bytes);
  if (out.byte_count != extent_bytes)
    return make_error(errc::malformed_message,
                      "byteCount {} disagrees with shape {} of {} ({} bytes with strides {})",
                      out.byte_count, out.shape, out.type, extent_bytes, out.strides);

  auto kind = static_cast<std::uint16_t>(header.getDeviceKind());
  if (kind > static_cast<std::uint16_t>(device_kind::cuda))
    return make_error(errc::malformed_message, "deviceKind {} is unknown (wire values are [0, 2))",
                      kind);
  auto index = header.getDeviceIndex();
  if (index < 0 || index > 65535)
    return make_error(errc::malformed_message, "deviceIndex {} but must be in [0, 65535]", index);
  out.where = device{static_cast<device_kind>(kind), index};
  return out;
}

void write_tensor_header(wire::TensorHeader::Builder header, const tensor_layout& layout) {
  header.setDtype(static_cast<std::uint8_t>(layout.type));
  auto shape = header.initShape(static_cast<unsigned>(layout.shape.size()));
  for (unsigned d = 0; d < layout.shape.size(); ++d)
    shape.set(d, layout.shape[d]);
  auto strides = header.initStrides(static_cast<unsigned>(layout.strides.size()));
  for (unsigned d = 0; d < layout.strides.size(); ++d)
    strides.set(d, layout.strides[d]);
  header.setByteCount(layout.byte_count);
  header.setDeviceKind(layout.where.kind == device_kind::cuda ? wire::DeviceKind::CUDA
                                                               : wire::DeviceKind::CPU);
  header.setDeviceIndex(layout.where.index);
}

expected<std::size_t> frame_size(std::span<const std::byte> bytes, std::size_t max_bytes) {
  // Flat Cap'n Proto framing: u32 (segment count - 1), u32 size in words per
  // segment, padded to a word; then the segments.
  if (bytes.size() < 8)
    return make_error(errc::malformed_message,
                      "header truncated: {} bytes is shorter than the 8-byte segment table",
                      bytes.size());
  std::uint64_t segments = std::uint64_t{load_u32(bytes.data())} + 1;
  if (segments > max_segments)
    return make_error(errc::malformed_message,
                      "header has {} segments but must have at most {}", segments, max_segments);
  std::uint64_t table_bytes = (segments + 2) / 2 * 8;
  if (bytes.size() < table_bytes)
    return make_error(errc::malformed_message,
                      "header truncated: segment table needs {} bytes but {} arrived", table_bytes,
                      bytes.size());
  std::uint64_t words = 0;
  for (std::uint64_t s = 0; s < segments; ++s)
    words += load_u32(bytes.data() + 4 + 4 * s);
  std::uint64_t total = table_bytes + words * 8;
  if (total > max_bytes)
    return make_error(errc::size_limit_exceeded, "header frame is {} bytes but the limit is {}",
                      total, max_bytes);
  return static_cast<std::size_t>(total);
}

std::vector<std::uint64_t> flatten(capnp::MessageBuilder& builder) {
  auto flat = capnp::messageToFlatArray(builder);
  std::vector<std::uint64_t> words(flat.size());
  std::memcpy(words.data(), flat.begin(), flat.size() * sizeof(capnp::word));
  return words;
}

} // namespace troupe::detail
