#include "troupe/serialization/shard_writer.hpp"

#include <algorithm>
#include <map>
#include <system_error>

#include <fmt/ranges.h>

#include "checkpoint_layout.hpp"
#include "durable_file.hpp"
#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/serialization/checksum.hpp"

namespace troupe {

tensor_piece split_piece(std::string name, tensor value, dims global_shape, std::int64_t dim,
                         std::int64_t offset) {
  auto rank = static_cast<std::int64_t>(global_shape.size());
  require(dim >= -1 && dim < rank, "split_piece: '{}' is split along dimension {} but has rank {}", name, dim,
          rank);
  dims offsets(global_shape.size(), 0);
  if (dim >= 0)
    offsets[static_cast<std::size_t>(dim)] = offset;
  return {std::move(name), std::move(value), std::move(global_shape), std::move(offsets)};
}

std::size_t replica_writer(const tensor_piece& piece, std::size_t holders) {
  require(holders > 0, "replica_writer: '{}' has no holders", piece.name);
  auto hash = crc32c(0, std::as_bytes(std::span(piece.name)));
  hash = crc32c(hash, std::as_bytes(std::span(piece.offset)));
  return hash % holders;
}

shard_writer::shard_writer(std::filesystem::path root, std::uint64_t step, std::string writer)
    : root_(std::move(root)), step_(step), writer_(std::move(writer)) {
  require(detail::is_plain_file_name(writer_),
          "shard_writer: writer name '{}' must be 1 to 255 of [A-Za-z0-9._-], not starting with '.'", writer_);
}

void shard_writer::add(tensor_piece piece) {
  const auto& value = piece.value;
  require(value.defined(), "shard_writer::add: '{}' is undefined", piece.name);
  require(value.where().kind == device_kind::cpu, "shard_writer::add: '{}' is on {}; move it to the CPU first",
          piece.name, value.where());
  auto rank = piece.global_shape.size();
  require(value.shape().size() == rank && piece.offset.size() == rank,
          "shard_writer::add: '{}' has shape {} at offset {} but its global shape is {}", piece.name, value.shape(),
          piece.offset, piece.global_shape);
  for (std::size_t d = 0; d < rank; ++d)
    require(piece.offset[d] >= 0 && piece.offset[d] + value.shape()[d] <= piece.global_shape[d],
            "shard_writer::add: '{}' of shape {} at offset {} lies outside its global shape {}", piece.name,
            value.shape(), piece.offset, piece.global_shape);
  pieces_.push_back(std::move(piece));
}

void shard_writer::add(tensor_piece piece, std::span<const std::string> holders) {
  require(std::find(holders.begin(), holders.end(), writer_) != holders.end(),
          "shard_writer::add: writer '{}' is not among the holders {} of '{}'", writer_, holders, piece.name);
  if (holders[replica_writer(piece, holders.size())] == writer_)
    add(std::move(piece));
}

expected<std::vector<checkpoint_tensor>> shard_writer::write() const {
  auto directory = staging_path(root_, step_);
  std::error_code failure;
  std::filesystem::create_directories(directory, failure);
  if (failure)
    return make_error(errc::io_error, "cannot create '{}': {}", directory.string(), failure.message());
  auto written = write_shard(directory);
  if (!written)
    return written;
  // The report last: once it exists, the shard it describes is durable.
  auto report = encode_manifest({step_, *written, {}});
  auto reported = detail::write_file_atomically(directory / (writer_ + detail::report_suffix),
                                                [&](detail::file_sink& out) { return out.write(report); });
  if (!reported)
    return reported.error();
  return written;
}

void shard_writer::report_failure(const error& why) const {
  auto directory = staging_path(root_, step_);
  std::error_code failure;
  std::filesystem::create_directories(directory, failure);
  auto text = why.message();
  (void)detail::write_file_atomically(directory / (writer_ + detail::failure_suffix), [&](detail::file_sink& out) {
    return out.write(std::as_bytes(std::span(text)));
  });
}

expected<std::vector<checkpoint_tensor>> shard_writer::write_shard(const std::filesystem::path& directory) const {
  if (pieces_.empty())
    return std::vector<checkpoint_tensor>{};

  // The shard is an ordinary checkpoint file; its entries are named
  // "<tensor>@<offset>" so that it stays readable on its own.
  named_tensors entries;
  for (const auto& piece : pieces_)
    entries.emplace_back(fmt::format("{}@{}", piece.name, fmt::join(piece.offset, ",")), piece.value);
  auto file = writer_ + ".shard";
  auto extents = save_checkpoint_with_extents(directory / file, entries,
                                              {{"writer", writer_}, {"step", std::to_string(step_)}});
  if (!extents)
    return extents.error();

  std::map<std::string, checkpoint_tensor> tensors;
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const auto& piece = pieces_[i];
    auto& t = tensors[piece.name];
    t.name = piece.name;
    t.type = piece.value.type();
    t.global_shape = piece.global_shape;
    const auto& extent = (*extents)[i];
    t.pieces.push_back({piece.offset, piece.value.shape(), file, extent.offset, extent.bytes, extent.crc32c});
  }
  std::vector<checkpoint_tensor> out;
  for (auto& [name, t] : tensors)
    out.push_back(std::move(t));
  return out;
}

} // namespace troupe
