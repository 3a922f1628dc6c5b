#pragma once
// The bytes of parameter-server requests (parallel/parameter_server.hpp).
// A request is one uint8 tensor: a 32-byte header, then little-endian arrays.
//
//   header  magic "tPS1" u32 | op u8 | flags u8 | table u16 | trainer u32 |
//           reserved u32 (0) | count_a u64 | count_b u64
//   lookup     count_a = bags, count_b = ids:
//              offsets i64[bags] | ids i64[ids] | weights f32[ids] (flags & 1)
//   gradients  count_a = rows, count_b = dim:
//              ids i64[rows] | rows f32[rows * dim]
//   checkpoint requests (save, load, apply_load, await_load; parallel::
//   checkpoints sends them, ps_checkpoint.hpp): table = the tracked
//   server's index, count_a = the checkpoint's step, count_b = the tables'
//   step, then the directory as text (save and load: 1 to 4096 bytes, no
//   NUL; the others: none). flags & 1 on save: asynchronous.
//
// Replies are plain tensors: float32 [bags, dim] (message_kind::parameters),
// or the error's text as uint8 (message_kind::control).
//
// decode() trusts nothing: the magic, op, flags, reserved field, every count
// against the bytes received, and the offsets (first 0, never decreasing,
// none past the ids) are checked before any array is read; ids are checked
// by the shard, which knows its rows.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel::ps_wire {

enum class op : std::uint8_t { lookup = 1, gradients = 2, save = 3, load = 4, apply_load = 5, await_load = 6 };

inline constexpr std::uint32_t magic = 0x31535074; // "tPS1" little-endian
inline constexpr std::size_t header_bytes = 32;
inline constexpr std::uint8_t flag_weighted = 1;
inline constexpr std::uint8_t flag_asynchronous = 1;
inline constexpr std::size_t max_directory_bytes = 4096;

struct lookup_request {
  std::uint16_t table = 0;
  std::uint32_t trainer = 0;
  std::span<const std::int64_t> offsets;
  std::span<const std::int64_t> ids;
  std::span<const float> weights; ///< empty: unweighted
};

struct gradients_request {
  std::uint16_t table = 0;
  std::uint32_t trainer = 0;
  std::int64_t dim = 0;
  std::span<const std::int64_t> ids;
  std::span<const float> rows; ///< ids.size() * dim
};

/// A checkpoint request (docs/design.md, "Saving and resuming a job").
struct checkpoint_request {
  std::uint16_t server = 0; ///< which tracked parameter server (writer names)
  std::uint32_t trainer = 0;
  bool asynchronous = false;
  std::uint64_t checkpoint_step = 0;
  std::uint64_t table_step = 0;
  std::string_view directory; ///< save: the checkpoints' root; load: the step-<N> directory
};

/// A decoded request; its spans point into the tensor given to decode().
struct request {
  op kind = op::lookup;
  lookup_request lookup;
  gradients_request gradients;
  checkpoint_request checkpoint;
};

tensor encode_checkpoint(op kind, const checkpoint_request& request);

tensor encode_lookup(std::uint16_t table, std::uint32_t trainer, std::span<const std::int64_t> offsets,
                     std::span<const std::int64_t> ids, std::span<const float> weights);

/// A gradients request to fill in place: `ids` and `rows` point into `bytes`.
struct gradients_buffer {
  tensor bytes;
  std::int64_t* ids = nullptr;
  float* rows = nullptr;
};
/// `allocate(bytes)` gives the uint8 buffer (the node's shared arena, so a
/// same-host server maps it instead of receiving a copy); empty: the heap.
gradients_buffer make_gradients(std::uint16_t table, std::uint32_t trainer, std::int64_t rows, std::int64_t dim,
                                const std::function<tensor(std::int64_t bytes)>& allocate = {});

/// errc::malformed_message naming what is wrong.
expected<request> decode(const tensor& bytes);

/// The error reply's text (uint8 tensor) and back.
tensor encode_text(const std::string& text);
std::string decode_text(const tensor& bytes);

} // namespace troupe::parallel::ps_wire
