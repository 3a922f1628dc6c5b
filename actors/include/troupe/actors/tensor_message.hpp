#pragma once
// The message that carries a tensor to an actor, whichever plane moved it.
#include <cstdint>

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
  /// untraced).
  std::uint64_t flow_id = 0;
};

/// CAF serialization, used only when a tensor_message goes through CAF's own
/// remote path (BASP) instead of the data plane: encodes with the zero-copy
/// codec and decodes with the validating decoder (serialization/), so bytes
/// from the network are checked like any data-plane frame.
caf::error inspect(caf::serializer& sink, tensor_message& message);
caf::error inspect(caf::deserializer& source, tensor_message& message);

std::string to_string(const tensor_message& message);

} // namespace troupe::actors
