#include "troupe/actors/message_types.hpp"

#include "troupe/actors/error_category.hpp"
#include "troupe/actors/tensor_message.hpp"

namespace troupe::actors {

void add_message_types(caf::actor_system_config& config) {
  // The control-plane protocols (registry.hpp, node.hpp) use only CAF's
  // built-in types (strings, string vectors and maps, actors, messages);
  // everything troupe-specific is listed here.
  config.add_message_type<tensor_message>("troupe.tensor_message");
  add_error_category(config);
}

} // namespace troupe::actors
