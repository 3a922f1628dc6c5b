#pragma once
// The message that carries a tensor to an actor, whichever plane moved it.
#include <cstdint>
#include <string>

#include <caf/fwd.hpp>

#include "troupe/serialization/message_meta.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::actors {

/// A tensor plus what it is for. Inside one process it travels as a CAF
/// message by reference: `value` shares storage, handlers take it by
/// `const&`, nothing is copied. Between processes the data plane (UCX)
/// carries it and the receiving side delivers an ordinary local message, so
/// actor code never sees which plane was used.
struct tensor_message {
  message_meta meta;
  tensor value;
  /// Links the send and receive records of this message in a trace (0 when
  /// untraced). On the wire it is `meta.flow_id`: whoever encodes copies it
  /// there, whoever decodes copies it back.
  std::uint64_t flow_id = 0;
};

/// Limits applied when a tensor_message is read from a CAF byte stream.
/// Set once per process before the actor system starts (BASP has no
/// receive-size limit of its own, docs/design.md).
void set_tensor_message_payload_limit(std::uint64_t max_payload_bytes);

/// CAF serialization, used only when a tensor_message goes through CAF's own
/// remote path (BASP) instead of the data plane: encodes with the zero-copy
/// codec and decodes with the validating decoder (serialization/), so bytes
/// from the network are checked like any data-plane frame.
///
/// Stream layout: u32 header length, the Cap'n Proto header frame, u64
/// payload length, the payload bytes (`apply_raw`, straight from tensor
/// memory on the way out, into a 64-byte aligned buffer on the way in).
caf::error inspect(caf::serializer& sink, tensor_message& message);
caf::error inspect(caf::deserializer& source, tensor_message& message);

/// "tensor_message(forward_activation -> stage1, step 3, mb 0, float32[4, 8])".
std::string to_string(const tensor_message& message);

} // namespace troupe::actors
