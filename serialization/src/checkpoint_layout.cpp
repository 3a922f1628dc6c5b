#include "checkpoint_layout.hpp"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include <fmt/ranges.h>

namespace troupe::detail {

namespace {

/// Largest accepted dimension or offset, in elements (as for wire headers).
constexpr std::int64_t max_extent = std::int64_t{1} << 40;
/// Byte offsets stay below this, so offset + count cannot overflow.
constexpr std::uint64_t max_byte_offset = std::uint64_t{1} << 62;
/// Steps the search for an uncovered element may take (it runs only on a
/// manifest already known to be bad, to name the gap).
constexpr std::size_t search_budget = 1u << 16;

std::string describe(const checkpoint_tensor& t, std::size_t i) {
  const auto& piece = t.pieces[i];
  return fmt::format("tensor '{}' piece {} (offset {}, shape {}, file '{}')", t.name, i, piece.offset,
                     piece.shape, piece.file);
}

bool within(const dims& values, std::int64_t high) {
  return std::all_of(values.begin(), values.end(), [&](auto v) { return v >= 0 && v <= high; });
}

expected<void> check_piece(const checkpoint_tensor& t, std::size_t i, const manifest_options& options) {
  const auto& piece = t.pieces[i];
  auto rank = t.global_shape.size();
  if (piece.offset.size() != rank || piece.shape.size() != rank)
    return make_error(errc::malformed_message, "{}: rank is {} but the tensor's is {}", describe(t, i),
                      piece.shape.size() != rank ? piece.shape.size() : piece.offset.size(), rank);
  if (!within(piece.offset, max_extent) || !within(piece.shape, max_extent))
    return make_error(errc::malformed_message, "{}: every offset and extent must be in [0, 2^40]",
                      describe(t, i));
  for (std::size_t d = 0; d < rank; ++d)
    if (piece.offset[d] + piece.shape[d] > t.global_shape[d])
      return make_error(errc::malformed_message, "{}: lies outside the global shape {} in dimension {}",
                        describe(t, i), t.global_shape, d);
  if (!is_plain_file_name(piece.file))
    return make_error(errc::malformed_message,
                      "{}: file name '{}' is not a plain name inside the checkpoint's directory",
                      describe(t, i), piece.file);
  auto element = size_of(t.type);
  auto count = element_count(piece.shape);
  if (!count || *count > options.max_piece_bytes / element)
    return make_error(errc::size_limit_exceeded, "{}: is more than the limit of {} bytes", describe(t, i),
                      options.max_piece_bytes);
  if (piece.byte_count != *count * element)
    return make_error(errc::malformed_message, "{}: byte count is {} but {} of {} takes {}",
                      describe(t, i), piece.byte_count, piece.shape, t.type, *count * element);
  if (piece.byte_offset > max_byte_offset)
    return make_error(errc::malformed_message, "{}: byte offset {} is above 2^62", describe(t, i),
                      piece.byte_offset);
  return {};
}

/// Finds an element of the box [0, global) that no box in `covering` holds,
/// fixing one dimension at a time. Along dimension d, the first uncovered
/// coordinate is 0 or where some box ends (slide an uncovered element down
/// until the box below stops it), so those are the only candidates.
bool find_uncovered(const std::vector<const box*>& covering, const dims& global, std::size_t d,
                    dims& element, std::size_t& budget) {
  if (covering.empty()) {
    std::fill(element.begin() + static_cast<std::ptrdiff_t>(d), element.end(), 0);
    return true;
  }
  if (d == global.size())
    return false;
  std::vector<std::int64_t> candidates{0};
  for (const auto* b : covering)
    if (b->offset[d] + b->shape[d] < global[d])
      candidates.push_back(b->offset[d] + b->shape[d]);
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (auto c : candidates) {
    if (budget == 0)
      return false;
    --budget;
    std::vector<const box*> next;
    for (const auto* b : covering)
      if (b->offset[d] <= c && c < b->offset[d] + b->shape[d])
        next.push_back(b);
    element[d] = c;
    if (find_uncovered(next, global, d + 1, element, budget))
      return true;
  }
  return false;
}

/// The pieces (already each inside the tensor) tile it: no two share an
/// element, and together they hold as many elements as the tensor.
expected<void> check_tiling(const checkpoint_tensor& t) {
  auto total = element_count(t.global_shape);
  if (!total)
    return make_error(errc::malformed_message, "tensor '{}': global shape {} has more than 2^63 elements",
                      t.name, t.global_shape);
  std::vector<box> boxes;
  std::vector<std::size_t> order;
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < t.pieces.size(); ++i) {
    boxes.push_back({t.pieces[i].offset, t.pieces[i].shape});
    auto count = *element_count(t.pieces[i].shape);
    covered += count;
    if (count > 0)
      order.push_back(i);
  }
  // Sweep along dimension 0: only boxes whose first ranges meet can overlap.
  auto first_start = [&](std::size_t i) { return boxes[i].offset.empty() ? 0 : boxes[i].offset[0]; };
  auto first_end = [&](std::size_t i) { return boxes[i].offset.empty() ? 1 : boxes[i].offset[0] + boxes[i].shape[0]; };
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return first_start(a) < first_start(b); });
  for (std::size_t a = 0; a < order.size(); ++a)
    for (std::size_t b = a + 1; b < order.size() && first_start(order[b]) < first_end(order[a]); ++b)
      if (auto shared = intersect(boxes[order[a]], boxes[order[b]]))
        return make_error(errc::malformed_message, "{} overlaps piece {} in the box at {} of shape {}",
                          describe(t, std::min(order[a], order[b])), std::max(order[a], order[b]),
                          shared->offset, shared->shape);
  if (covered == *total)
    return {};
  std::vector<const box*> covering;
  for (auto i : order)
    covering.push_back(&boxes[i]);
  dims element(t.global_shape.size(), 0);
  std::size_t budget = search_budget;
  auto where = find_uncovered(covering, t.global_shape, 0, element, budget)
                   ? fmt::format("; the element at {} is in no piece", element)
                   : std::string();
  return make_error(errc::malformed_message, "tensor '{}' (global shape {}): the pieces cover {} of its {} elements{}",
                    t.name, t.global_shape, covered, *total, where);
}

} // namespace

std::optional<std::uint64_t> element_count(const dims& shape) {
  std::uint64_t count = 1;
  for (auto extent : shape) {
    if (extent < 0 || __builtin_mul_overflow(count, static_cast<std::uint64_t>(extent), &count) ||
        count > (std::uint64_t{1} << 63))
      return std::nullopt;
  }
  return count;
}

std::optional<box> intersect(const box& a, const box& b) {
  box out{dims(a.offset.size()), dims(a.offset.size())};
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    auto low = std::max(a.offset[d], b.offset[d]);
    auto high = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (high <= low)
      return std::nullopt;
    out.offset[d] = low;
    out.shape[d] = high - low;
  }
  return out;
}

bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name.front() == '.' || name == manifest_file_name)
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

expected<void> validate_manifest(const checkpoint_manifest& manifest, const manifest_options& options) {
  if (manifest.tensors.size() > options.max_tensors)
    return make_error(errc::size_limit_exceeded, "manifest has {} tensors, above the limit {}",
                      manifest.tensors.size(), options.max_tensors);
  std::unordered_set<std::string_view> names;
  for (const auto& t : manifest.tensors) {
    if (t.name.empty())
      return make_error(errc::malformed_message, "a tensor of the manifest has an empty name");
    if (!names.insert(t.name).second)
      return make_error(errc::malformed_message, "tensor '{}' appears twice", t.name);
    if (t.global_shape.size() > options.max_rank)
      return make_error(errc::size_limit_exceeded, "tensor '{}': rank {} is above the limit {}", t.name,
                        t.global_shape.size(), options.max_rank);
    if (!within(t.global_shape, max_extent))
      return make_error(errc::malformed_message, "tensor '{}': global shape {} has a dimension outside [0, 2^40]",
                        t.name, t.global_shape);
    if (t.pieces.size() > options.max_pieces)
      return make_error(errc::size_limit_exceeded, "tensor '{}' has {} pieces, above the limit {}", t.name,
                        t.pieces.size(), options.max_pieces);
    for (std::size_t i = 0; i < t.pieces.size(); ++i)
      if (auto ok = check_piece(t, i, options); !ok)
        return ok;
    if (options.require_tiling)
      if (auto ok = check_tiling(t); !ok)
        return ok;
  }
  return {};
}

void copy_box(const std::byte* from, const dims& from_shape, const dims& from_origin, std::byte* to,
              const dims& to_shape, const dims& to_origin, const dims& extent, std::size_t element) {
  auto rank = extent.size();
  if (std::any_of(extent.begin(), extent.end(), [](auto e) { return e <= 0; }))
    return;
  if (rank == 0) {
    std::memcpy(to, from, element);
    return;
  }
  // Byte strides of both dense arrays; rows along the last dimension are
  // contiguous in both, so each is one memcpy.
  auto strides_of = [&](const dims& shape) {
    std::vector<std::uint64_t> strides(rank);
    std::uint64_t step = element;
    for (auto d = rank; d-- > 0;) {
      strides[d] = step;
      step *= static_cast<std::uint64_t>(shape[d]);
    }
    return strides;
  };
  auto from_strides = strides_of(from_shape);
  auto to_strides = strides_of(to_shape);
  for (std::size_t d = 0; d < rank; ++d) {
    from += static_cast<std::uint64_t>(from_origin[d]) * from_strides[d];
    to += static_cast<std::uint64_t>(to_origin[d]) * to_strides[d];
  }
  auto row = static_cast<std::size_t>(extent[rank - 1]) * element;
  dims index(rank - 1, 0);
  for (;;) {
    std::uint64_t from_at = 0;
    std::uint64_t to_at = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) {
      from_at += static_cast<std::uint64_t>(index[d]) * from_strides[d];
      to_at += static_cast<std::uint64_t>(index[d]) * to_strides[d];
    }
    std::memcpy(to + to_at, from + from_at, row);
    // Next row: an odometer over the leading dimensions.
    auto d = rank - 1;
    for (;;) {
      if (d == 0)
        return;
      --d;
      if (++index[d] < extent[d])
        break;
      index[d] = 0;
    }
  }
}

} // namespace troupe::detail
