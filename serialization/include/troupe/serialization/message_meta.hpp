#pragma once
// What a data-plane message is for and where it goes: everything in the
// Cap'n Proto header except the tensor layout (docs/design.md, "The two planes").
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "troupe/serialization/fwd.hpp"
#include "troupe/tensor/device.hpp"

namespace troupe {

/// The purpose of a training message. Values are wire values: never
/// renumber, only append (schema/troupe.capnp, TrainingMessage.Kind).
enum class message_kind : std::uint8_t {
  control = 0,
  forward_activation = 1,
  backward_gradient = 2,
  gradient_bucket = 3,
  parameters = 4,
};

/// Number of message kinds; valid wire values are [0, message_kind_count).
inline constexpr int message_kind_count = 5;

constexpr std::string_view name_of(message_kind kind) {
  switch (kind) {
    case message_kind::control: return "control";
    case message_kind::forward_activation: return "forward_activation";
    case message_kind::backward_gradient: return "backward_gradient";
    case message_kind::gradient_bucket: return "gradient_bucket";
    case message_kind::parameters: return "parameters";
  }
  return "invalid";
}

/// Routing and schedule metadata of one data-plane message.
struct message_meta {
  message_kind kind = message_kind::control;
  std::uint64_t step = 0;
  std::uint32_t micro_batch = 0;
  /// Identifies the collective or request this message belongs to.
  std::uint64_t context_id = 0;
  /// Name of the destination actor on the receiving node.
  std::string destination;
  /// The job's token; the data plane fills it in on send and checks it on
  /// receive before anything else (0 outside the data plane).
  std::uint64_t token = 0;
  /// Links the send and receive records of this message in a trace (0 when
  /// untraced).
  std::uint64_t flow_id = 0;
  /// Where the receiving node puts the tensor before an actor sees it (the
  /// sender's device map, applied by its tensor router); none: on the host,
  /// as the plane carried it.
  std::optional<device> landing = std::nullopt;

  friend bool operator==(const message_meta&, const message_meta&) = default;
};

} // namespace troupe
