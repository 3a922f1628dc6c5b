#include "troupe/serialization/checkpoint_reader.hpp"

#include <algorithm>

#include <fmt/ranges.h>

#include "checkpoint_layout.hpp"
#include "durable_file.hpp"
#include "troupe/serialization/checksum.hpp"

namespace troupe {

namespace {

std::string describe(const checkpoint_tensor& t, std::size_t i) {
  const auto& piece = t.pieces[i];
  return fmt::format("tensor '{}' piece {} (offset {}, shape {}) in file '{}'", t.name, i, piece.offset,
                     piece.shape, piece.file);
}

/// The piece's byte range lies inside its file (checked before anything of
/// the piece's size is allocated).
expected<void> check_range(const checkpoint_tensor& t, std::size_t i, const detail::read_only_file& file) {
  const auto& piece = t.pieces[i];
  if (piece.byte_offset + piece.byte_count > file.size())
    return make_error(errc::malformed_message, "{}: bytes [{}, +{}) run past the file's end at {} (truncated?)",
                      describe(t, i), piece.byte_offset, piece.byte_count, file.size());
  return {};
}

/// Bytes read at a time: each part is hashed right after it is read, while
/// it is still in cache, instead of the whole piece read back afterwards.
constexpr std::uint64_t read_part_bytes = std::uint64_t{1} << 20;
/// How far ahead of the part being read and hashed the disk is asked to
/// read, so it keeps reading while this thread hashes and copies; bounded
/// so a large piece does not ask for all its pages at once.
constexpr std::uint64_t read_ahead_bytes = std::uint64_t{16} << 20;

/// Reads the piece's bytes from `file` and checks their CRC32C.
expected<tensor> load_piece(const checkpoint_tensor& t, std::size_t i, const detail::read_only_file& file) {
  if (auto ok = check_range(t, i, file); !ok)
    return ok.error();
  const auto& piece = t.pieces[i];
  auto value = tensor::empty(piece.shape, t.type);
  auto* bytes = static_cast<std::byte*>(value.raw_data());
  std::uint32_t crc = 0;
  file.will_read(std::min(read_ahead_bytes, piece.byte_count), piece.byte_offset);
  for (std::uint64_t done = 0; done < piece.byte_count;) {
    const auto part = std::min(read_part_bytes, piece.byte_count - done);
    if (const auto ahead = done + read_ahead_bytes; ahead < piece.byte_count)
      file.will_read(std::min(part, piece.byte_count - ahead), piece.byte_offset + ahead);
    if (auto ok = file.read(bytes + done, part, piece.byte_offset + done); !ok)
      return make_error(ok.error().code(), "{}: {}", describe(t, i), ok.error().message());
    crc = crc32c(crc, std::span<const std::byte>(bytes + done, part));
    done += part;
  }
  if (crc != piece.crc32c)
    return make_error(errc::checksum_mismatch, "{}: bytes [{}, +{}) hash to CRC32C {:#010x} but the manifest says {:#010x}",
                      describe(t, i), piece.byte_offset, piece.byte_count, crc, piece.crc32c);
  return value;
}

} // namespace

checkpoint_reader::checkpoint_reader(std::filesystem::path directory, checkpoint_manifest manifest)
    : directory_(std::move(directory)), manifest_(std::move(manifest)) {
  for (std::size_t i = 0; i < manifest_.tensors.size(); ++i)
    by_name_.emplace(manifest_.tensors[i].name, i);
}

expected<checkpoint_reader> checkpoint_reader::open(const std::filesystem::path& directory,
                                                    const manifest_options& options) {
  auto manifest = read_manifest(directory / detail::manifest_file_name, options);
  if (!manifest)
    return manifest.error();
  return checkpoint_reader(directory, std::move(*manifest));
}

const checkpoint_tensor* checkpoint_reader::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &manifest_.tensors[it->second];
}

expected<tensor> checkpoint_reader::read(std::string_view name) const {
  const auto* t = find(name);
  if (t == nullptr)
    return make_error(errc::state_mismatch, "checkpoint '{}' has no tensor '{}'", directory_.string(), name);
  return read(name, {dims(t->global_shape.size(), 0), t->global_shape});
}

expected<tensor> checkpoint_reader::read(std::string_view name, const tensor_region& region) const {
  const auto* t = find(name);
  if (t == nullptr)
    return make_error(errc::state_mismatch, "checkpoint '{}' has no tensor '{}'", directory_.string(), name);
  auto rank = t->global_shape.size();
  bool inside = region.offset.size() == rank && region.shape.size() == rank;
  for (std::size_t d = 0; inside && d < rank; ++d)
    inside = region.offset[d] >= 0 && region.shape[d] >= 0 &&
             region.offset[d] <= t->global_shape[d] - region.shape[d];
  if (!inside)
    return make_error(errc::invalid_argument, "tensor '{}' of shape {}: the region at {} of shape {} is not inside it",
                      t->name, t->global_shape, region.offset, region.shape);

  // The pieces the region meets, and their files' lengths, before the
  // region's buffer is allocated.
  detail::box wanted{region.offset, region.shape};
  std::vector<std::pair<std::size_t, detail::box>> overlaps;
  std::map<std::string, detail::read_only_file, std::less<>> files;
  for (std::size_t i = 0; i < t->pieces.size(); ++i) {
    const auto& piece = t->pieces[i];
    auto shared = detail::intersect(wanted, {piece.offset, piece.shape});
    if (!shared)
      continue;
    overlaps.emplace_back(i, std::move(*shared));
    if (!files.contains(piece.file)) {
      auto file = detail::read_only_file::open(directory_ / piece.file);
      if (!file)
        return make_error(file.error().code(), "tensor '{}': {}", t->name, file.error().message());
      files.emplace(piece.file, std::move(*file));
    }
    if (auto ok = check_range(*t, i, files.at(piece.file)); !ok)
      return ok.error();
  }

  // The region is one saved piece (a whole tensor saved whole, a shard read
  // at its own layout): the piece's buffer is the answer, no copy.
  if (overlaps.size() == 1 && t->pieces[overlaps[0].first].offset == region.offset &&
      t->pieces[overlaps[0].first].shape == region.shape)
    return load_piece(*t, overlaps[0].first, files.at(t->pieces[overlaps[0].first].file));

  auto out = tensor::empty(region.shape, t->type);
  std::uint64_t covered = 0;
  for (const auto& [i, shared] : overlaps) {
    const auto& piece = t->pieces[i];
    auto value = load_piece(*t, i, files.at(piece.file));
    if (!value)
      return value.error();
    dims from(rank), to(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      from[d] = shared.offset[d] - piece.offset[d];
      to[d] = shared.offset[d] - region.offset[d];
    }
    detail::copy_box(static_cast<const std::byte*>(value->raw_data()), piece.shape, from,
                     static_cast<std::byte*>(out.raw_data()), region.shape, to, shared.shape, size_of(t->type));
    covered += *detail::element_count(shared.shape);
  }
  // The manifest's pieces tile the tensor (checked when it was opened), so
  // this holds; it guards the copy above all the same.
  if (covered != static_cast<std::uint64_t>(out.numel()))
    return make_error(errc::malformed_message, "tensor '{}': the region at {} of shape {} is covered by {} of its {} elements",
                      t->name, region.offset, region.shape, covered, out.numel());
  return out;
}

expected<void> checkpoint_reader::read_into(std::string_view name, const dims& offset, tensor& destination) const {
  const auto* t = find(name);
  if (t != nullptr && t->type != destination.type())
    return make_error(errc::state_mismatch, "tensor '{}' is {} in the checkpoint but the destination is {}", name,
                      t->type, destination.type());
  auto value = read(name, {offset, destination.shape()});
  if (!value)
    return value.error();
  destination.copy_from(*value);
  return {};
}

expected<named_tensors> checkpoint_reader::read_all() const {
  named_tensors out;
  for (const auto& t : manifest_.tensors) {
    auto value = read(t.name);
    if (!value)
      return value.error();
    out.emplace_back(t.name, std::move(*value));
  }
  return out;
}

expected<tensor> checkpoint_reader::read_piece(const checkpoint_tensor& t, std::size_t piece) const {
  TROUPE_ASSERT(piece < t.pieces.size(), "read_piece: piece {} of '{}', which has {}", piece, t.name, t.pieces.size());
  auto file = detail::read_only_file::open(directory_ / t.pieces[piece].file);
  if (!file)
    return make_error(file.error().code(), "tensor '{}': {}", t.name, file.error().message());
  return load_piece(t, piece, *file);
}

expected<void> checkpoint_reader::verify() const {
  for (const auto& t : manifest_.tensors)
    for (std::size_t i = 0; i < t.pieces.size(); ++i)
      if (auto value = read_piece(t, i); !value)
        return value.error();
  return {};
}

} // namespace troupe
