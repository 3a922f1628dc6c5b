#include "troupe/serialization/encoded_message.hpp"

#include <cstring>

#include "wire.hpp"

namespace troupe {

namespace {

/// Elements from the first to the last addressed one, inclusive. Strides are
/// non-negative in troupe (tensor::from_storage), so the first element is
/// the lowest address.
std::int64_t extent_of(const tensor& value) {
  std::int64_t last = 0;
  for (std::int64_t d = 0; d < value.rank(); ++d)
    last += (value.shape()[d] - 1) * value.strides()[d];
  return last + 1;
}

} // namespace

encoded_message encode(const message_meta& meta, const tensor& value) {
  require(value.defined(), "encode: the tensor is undefined");
  encoded_message out;
  detail::tensor_layout layout;
  layout.type = value.type();
  layout.shape = value.shape();
  layout.where = value.where();
  if (value.numel() == 0 || value.is_contiguous()) {
    out.payload_ = value;
    layout.strides = contiguous_strides(value.shape());
    layout.byte_count = value.nbytes();
  } else if (auto extent = extent_of(value); extent <= value.numel()) {
    // Dense or broadcast view (transpose, permute, expand): ship the block it
    // covers with its strides; the receiver rebuilds the same view.
    out.payload_ = value;
    layout.strides = value.strides();
    for (std::int64_t d = 0; d < value.rank(); ++d)
      if (value.shape()[d] == 1)
        layout.strides[d] = 0;
    layout.byte_count = static_cast<std::uint64_t>(extent) * value.element_size();
  } else {
    // A view with gaps: copying it dense here is cheaper than shipping the
    // gaps. This is the one copy encode() ever makes.
    out.payload_ = value.contiguous();
    layout.strides = contiguous_strides(value.shape());
    layout.byte_count = value.nbytes();
  }
  out.payload_bytes_ = static_cast<std::size_t>(layout.byte_count);

  // Size the first segment so the header is one segment (no growth).
  auto words = 32 + 2 * layout.shape.size() + meta.destination.size() / 8;
  capnp::MallocMessageBuilder builder(static_cast<unsigned>(words));
  auto root = builder.initRoot<wire::TrainingMessage>();
  root.setKind(static_cast<wire::TrainingMessage::Kind>(meta.kind));
  root.setStep(meta.step);
  root.setMicroBatch(meta.micro_batch);
  root.setContextId(meta.context_id);
  root.setDestination(capnp::Text::Reader(meta.destination.data(), meta.destination.size()));
  root.setToken(meta.token);
  root.setFlowId(meta.flow_id);
  if (meta.landing) {
    root.setLandingKind(meta.landing->kind == device_kind::cuda ? wire::LandingKind::CUDA : wire::LandingKind::CPU);
    root.setLandingIndex(meta.landing->index);
  }
  detail::write_tensor_header(root.initTensor(), layout);
  out.header_words_ = detail::flatten(builder);
  return out;
}

std::vector<std::byte> encoded_message::to_flat_bytes() const {
  require(payload_.where().kind == device_kind::cpu,
          "encoded_message::to_flat_bytes: payload is on {}, not the CPU", payload_.where());
  auto header = header_bytes();
  auto body = payload();
  std::vector<std::byte> out(header.size() + body.size());
  std::memcpy(out.data(), header.data(), header.size());
  if (!body.empty())
    std::memcpy(out.data() + header.size(), body.data(), body.size());
  return out;
}

} // namespace troupe
