#include "troupe/actors/tensor_message.hpp"

#include <atomic>
#include <cstring>

#include <caf/deserializer.hpp>
#include <caf/serializer.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/actors/error_category.hpp"
#include "troupe/serialization/decode.hpp"
#include "troupe/serialization/encoded_message.hpp"

namespace troupe::actors {

namespace {

std::atomic<std::uint64_t> payload_limit{decode_options{}.max_payload_bytes};

} // namespace

void set_tensor_message_payload_limit(std::uint64_t max_payload_bytes) {
  payload_limit.store(max_payload_bytes, std::memory_order_relaxed);
}

caf::error inspect(caf::serializer& sink, tensor_message& message) {
  if (!message.value.defined())
    return make_caf_error(errc::invalid_argument, "tensor_message: the tensor is undefined");
  if (message.value.where().kind != device_kind::cpu)
    return make_caf_error(errc::invalid_argument,
                          fmt::format("tensor_message: CAF carries CPU tensors only, not {}",
                                      message.value.where()));
  auto meta = message.meta;
  meta.flow_id = message.flow_id;
  auto encoded = encode(meta, message.value);
  auto header = encoded.header_bytes();
  auto payload = encoded.payload();
  auto header_size = static_cast<std::uint32_t>(header.size());
  auto payload_size = static_cast<std::uint64_t>(payload.size());
  // apply_raw takes a non-const pointer for both directions; a serializer
  // only reads through it.
  if (auto err = sink(header_size))
    return err;
  if (auto err = sink.apply_raw(header.size(), const_cast<std::byte*>(header.data())))
    return err;
  if (auto err = sink(payload_size))
    return err;
  if (payload_size > 0)
    return sink.apply_raw(payload.size(), const_cast<std::byte*>(payload.data()));
  return {};
}

caf::error inspect(caf::deserializer& source, tensor_message& message) {
  decode_options options;
  options.max_payload_bytes = payload_limit.load(std::memory_order_relaxed);
  // Every length is checked before anything of that length is allocated.
  std::uint32_t header_size = 0;
  if (auto err = source(header_size))
    return err;
  if (header_size == 0 || header_size > options.max_header_bytes || header_size % 8 != 0)
    return make_caf_error(errc::malformed_message,
                          fmt::format("tensor_message: header length is {} but must be a "
                                      "multiple of 8 in [8, {}]",
                                      header_size, options.max_header_bytes));
  std::vector<std::uint64_t> header_words(header_size / 8);
  if (auto err = source.apply_raw(header_size, header_words.data()))
    return err;
  auto header = std::as_bytes(std::span<const std::uint64_t>(header_words));
  auto parsed = decode_header(header, options);
  if (!parsed)
    return to_caf_error(parsed.error());
  std::uint64_t payload_size = 0;
  if (auto err = source(payload_size))
    return err;
  if (payload_size != parsed->byte_count)
    return make_caf_error(errc::malformed_message,
                          fmt::format("tensor_message: payload length is {} but the header's "
                                      "byteCount is {}",
                                      payload_size, parsed->byte_count));
  auto payload = storage::allocate(static_cast<std::size_t>(payload_size));
  if (payload_size > 0)
    if (auto err = source.apply_raw(static_cast<std::size_t>(payload_size), payload->data()))
      return err;
  auto decoded = decode(header, std::move(payload), options);
  if (!decoded)
    return to_caf_error(decoded.error());
  message.meta = std::move(decoded->meta);
  message.flow_id = message.meta.flow_id;
  message.value = std::move(decoded->value);
  return {};
}

std::string to_string(const tensor_message& message) {
  if (!message.value.defined())
    return fmt::format("tensor_message({} -> {}, step {}, mb {}, undefined)",
                       name_of(message.meta.kind), message.meta.destination, message.meta.step,
                       message.meta.micro_batch);
  return fmt::format("tensor_message({} -> {}, step {}, mb {}, {}{})", name_of(message.meta.kind),
                     message.meta.destination, message.meta.step, message.meta.micro_batch,
                     message.value.type(), message.value.shape());
}

} // namespace troupe::actors
