#pragma once
// Private geometry of distributed checkpoints: boxes of a whole tensor, the
// checks that a tensor's pieces tile it exactly, and the copy of a box
// between dense row-major buffers (what resharding comes down to).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "troupe/serialization/checkpoint_manifest.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::detail {

/// The manifest's file name inside a checkpoint's directory.
inline constexpr std::string_view manifest_file_name = "manifest";
/// A writer's report of the pieces it wrote (`<writer>.pieces`), and of its
/// failure (`<writer>.failed`), in the staging directory.
inline constexpr const char* report_suffix = ".pieces";
inline constexpr const char* failure_suffix = ".failed";

/// A box of a tensor: where it starts and its extent, per dimension.
struct box {
  dims offset;
  dims shape;
};

/// Elements in a box of `shape`; nullopt when beyond 2^63.
std::optional<std::uint64_t> element_count(const dims& shape);

/// The box both `a` and `b` cover; nullopt when they share no element.
std::optional<box> intersect(const box& a, const box& b);

/// A name that stays inside a directory: [A-Za-z0-9._-], 1 to 255 bytes,
/// not starting with '.' (so neither "." nor ".." nor a hidden file), and
/// not the manifest's name.
bool is_plain_file_name(std::string_view name);

/// Every check parse_manifest() and commit_checkpoint() make of a manifest:
/// counts within `options`, names unique, every piece inside its tensor
/// with a byte count that matches its shape and a plain file name, and the
/// pieces tiling each tensor exactly (unless `options.require_tiling` is
/// off). Errors name the tensor and the piece.
expected<void> validate_manifest(const checkpoint_manifest& manifest, const manifest_options& options);

/// Copies the box of extent `extent` at `from_origin` inside the dense
/// row-major array `from` (of `from_shape`) to `to_origin` inside the dense
/// array `to` (of `to_shape`); elements are `element` bytes.
void copy_box(const std::byte* from, const dims& from_shape, const dims& from_origin, std::byte* to,
              const dims& to_shape, const dims& to_origin, const dims& extent, std::size_t element);

} // namespace troupe::detail
