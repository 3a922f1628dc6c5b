#include "troupe/serialization/decode.hpp"

#include "wire.hpp"

namespace troupe {

namespace {

/// Builds the tensor over `payload` (exactly byte_count bytes) once the
/// header has been validated.
expected<decoded_message> attach(message_header header, std::shared_ptr<storage> payload) {
  auto element = size_of(header.type);
  auto address = reinterpret_cast<std::uintptr_t>(payload->data());
  if (header.byte_count > 0 && address % element != 0)
    return make_error(errc::malformed_message,
                      "payload at address {:#x} is not aligned to {} bytes for {}", address,
                      element, header.type);
  decoded_message out;
  try {
    out.value = tensor::from_storage(std::move(payload), header.shape, header.strides, 0,
                                     header.type);
  } catch (const usage_error& e) {
    return make_error(errc::malformed_message, "header describes an invalid tensor: {}",
                      e.what());
  }
  out.meta = std::move(header.meta);
  out.sender_device = header.sender_device;
  return out;
}

/// The landing device: none (asCarried), cpu, or cuda:N with N in [0, 65535].
expected<std::optional<device>> read_landing(wire::TrainingMessage::Reader root) {
  auto kind = static_cast<std::uint16_t>(root.getLandingKind());
  auto index = root.getLandingIndex();
  switch (root.getLandingKind()) {
    case wire::LandingKind::AS_CARRIED: return std::optional<device>{};
    case wire::LandingKind::CPU: return std::optional<device>{device::cpu()};
    case wire::LandingKind::CUDA:
      if (index < 0 || index > 65535)
        return make_error(errc::malformed_message, "landingIndex {} but must be in [0, 65535]", index);
      return std::optional<device>{device::cuda(index)};
  }
  return make_error(errc::malformed_message, "landingKind {} is unknown (wire values are [0, 3))", kind);
}

} // namespace

expected<std::size_t> header_frame_size(std::span<const std::byte> bytes,
                                        const decode_options& options) {
  return detail::frame_size(bytes, options.max_header_bytes);
}

expected<message_header> decode_header(std::span<const std::byte> header,
                                       const decode_options& options) {
  return detail::with_frame(
      header, options.max_header_bytes,
      [&](capnp::MessageReader& reader) -> expected<message_header> {
        auto root = reader.getRoot<wire::TrainingMessage>();
        message_header out;
        auto kind = static_cast<std::uint16_t>(root.getKind());
        if (kind >= message_kind_count)
          return make_error(errc::malformed_message, "kind {} is unknown (wire values are [0, {}))",
                            kind, message_kind_count);
        out.meta.kind = static_cast<message_kind>(kind);
        out.meta.step = root.getStep();
        out.meta.micro_batch = root.getMicroBatch();
        out.meta.context_id = root.getContextId();
        auto destination = root.getDestination();
        out.meta.destination.assign(destination.cStr(), destination.size());
        out.meta.token = root.getToken();
        out.meta.flow_id = root.getFlowId();
        auto landing = read_landing(root);
        if (!landing)
          return landing.error();
        out.meta.landing = *landing;
        if (!root.hasTensor())
          return make_error(errc::malformed_message, "message has no tensor header");
        auto layout = detail::read_tensor_header(
            root.getTensor(), {options.max_payload_bytes, options.max_rank});
        if (!layout)
          return layout.error();
        out.type = layout->type;
        out.shape = std::move(layout->shape);
        out.strides = std::move(layout->strides);
        out.byte_count = layout->byte_count;
        out.sender_device = layout->where;
        return out;
      });
}

expected<decoded_message> decode(std::span<const std::byte> header,
                                 std::shared_ptr<storage> payload, const decode_options& options) {
  if (!payload)
    return make_error(errc::invalid_argument, "decode: payload storage is null");
  auto parsed = decode_header(header, options);
  if (!parsed)
    return parsed.error();
  if (payload->bytes() != parsed->byte_count)
    return make_error(errc::malformed_message, "payload is {} bytes but byteCount says {}",
                      payload->bytes(), parsed->byte_count);
  return attach(std::move(*parsed), std::move(payload));
}

expected<decoded_message> decode_flat(std::span<const std::byte> frame,
                                      std::shared_ptr<const void> owner,
                                      const decode_options& options) {
  auto size = header_frame_size(frame, options);
  if (!size)
    return size.error();
  if (*size > frame.size())
    return make_error(errc::malformed_message,
                      "header truncated: frame needs {} bytes but {} arrived", *size,
                      frame.size());
  auto parsed = decode_header(frame.first(*size), options);
  if (!parsed)
    return parsed.error();
  auto payload_bytes = frame.size() - *size;
  if (payload_bytes != parsed->byte_count)
    return make_error(errc::malformed_message, "payload is {} bytes but byteCount says {}",
                      payload_bytes, parsed->byte_count);
  // The tensor's storage is a window on the frame that holds `owner`.
  auto* start = const_cast<std::byte*>(frame.data() + *size);
  auto window = storage::wrap(start, payload_bytes, device::cpu(),
                              [owner = std::move(owner)](void*) {});
  return attach(std::move(*parsed), std::move(window));
}

expected<decoded_message> decode_flat(std::shared_ptr<storage> frame,
                                      const decode_options& options) {
  if (!frame)
    return make_error(errc::invalid_argument, "decode_flat: frame storage is null");
  std::span<const std::byte> bytes(static_cast<const std::byte*>(frame->data()), frame->bytes());
  return decode_flat(bytes, std::shared_ptr<const void>(frame), options);
}

} // namespace troupe
