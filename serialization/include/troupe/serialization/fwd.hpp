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
struct checkpoint_extent;
struct checkpoint_piece;
struct checkpoint_tensor;
struct checkpoint_manifest;
struct manifest_options;
struct tensor_piece;
class shard_writer;
struct commit_options;
struct tensor_region;
class checkpoint_reader;

} // namespace troupe
