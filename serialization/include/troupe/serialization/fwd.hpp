#pragma once
// Forward declarations for the serialization module.
#include <cstdint>

namespace troupe {

enum class message_kind : std::uint8_t;
struct message_meta;
class encoded_message;
struct decode_options;
struct message_header;
struct decoded_message;
struct checkpoint_options;
struct checkpoint_contents;

} // namespace troupe
