#include "troupe/serialization/checkpoint_file.hpp"

#include <cstring>
#include <string_view>
#include <unordered_set>

#include "durable_file.hpp"
#include "troupe/serialization/checksum.hpp"
#include "wire.hpp"

namespace troupe {

namespace {

// File layout: see checkpoint_file.hpp.
constexpr std::string_view file_magic{"TROUPECK", 8};
constexpr std::string_view trailer_magic{"TEND", 4};
constexpr std::uint32_t format_version = 1;
constexpr std::uint64_t preamble_bytes = 32;
constexpr std::uint64_t trailer_bytes = 8;
constexpr std::uint64_t payload_alignment = 64;

struct preamble {
  std::uint64_t index_bytes = 0;
  std::uint64_t payload_bytes = 0;
  /// File offset of the payload region: after the index, rounded up to 64
  /// bytes so every payload is 64-byte aligned in an aligned file buffer.
  std::uint64_t payload_start = 0;
};

std::uint64_t align_up(std::uint64_t n) {
  return (n + payload_alignment - 1) / payload_alignment * payload_alignment;
}

/// Checks magic, version and the announced sizes against the file length;
/// needs only the first 32 bytes, so it runs before the file is read in.
expected<preamble> check_preamble(std::span<const std::byte> head, std::uint64_t file_bytes,
                                  const checkpoint_options& options) {
  if (file_bytes < preamble_bytes + trailer_bytes)
    return make_error(errc::malformed_message,
                      "checkpoint is {} bytes, shorter than the {}-byte minimum", file_bytes,
                      preamble_bytes + trailer_bytes);
  if (std::memcmp(head.data(), file_magic.data(), file_magic.size()) != 0)
    return make_error(errc::malformed_message, "not a troupe checkpoint (wrong magic)");
  auto version = detail::load_field<std::uint32_t>(head.data() + 8);
  if (version != format_version)
    return make_error(errc::malformed_message, "checkpoint version is {} but must be {}", version,
                      format_version);
  preamble out{detail::load_field<std::uint64_t>(head.data() + 16), detail::load_field<std::uint64_t>(head.data() + 24)};
  if (out.index_bytes % 8 != 0 || out.index_bytes > options.max_index_bytes)
    return make_error(errc::malformed_message,
                      "index is {} bytes but must be a multiple of 8 in [8, {}]", out.index_bytes,
                      options.max_index_bytes);
  out.payload_start = align_up(preamble_bytes + out.index_bytes);
  auto available = file_bytes - trailer_bytes;
  if (out.payload_start > available || out.payload_bytes != available - out.payload_start)
    return make_error(errc::malformed_message,
                      "index ({} bytes) and payloads ({} bytes) disagree with the file length {} "
                      "(truncated or extended?)",
                      out.index_bytes, out.payload_bytes, file_bytes);
  return out;
}

std::span<const std::byte> bytes_of(const tensor& dense) {
  return {static_cast<const std::byte*>(dense.raw_data()), dense.nbytes()};
}

/// Writes the file; `crcs[i]` receives payload i's CRC32C.
expected<void> write_file(const std::filesystem::path& path, const named_tensors& dense,
                          const std::vector<std::uint64_t>& index,
                          const std::vector<std::uint64_t>& offsets, std::vector<std::uint32_t>& crcs,
                          std::uint64_t payload_bytes) {
  return detail::write_file_atomically(path, [&](detail::file_sink& out) -> expected<void> {
    std::byte head[preamble_bytes] = {};
    std::memcpy(head, file_magic.data(), file_magic.size());
    detail::store_field<std::uint32_t>(head + 8, format_version);
    detail::store_field<std::uint64_t>(head + 16, index.size() * 8);
    detail::store_field<std::uint64_t>(head + 24, payload_bytes);
    if (auto ok = out.write(head); !ok)
      return ok;
    if (auto ok = out.write(std::as_bytes(std::span(index))); !ok)
      return ok;
    auto index_end = preamble_bytes + index.size() * 8;
    if (auto ok = out.pad(align_up(index_end) - index_end); !ok)
      return ok;
    std::uint64_t position = 0;
    for (std::size_t i = 0; i < dense.size(); ++i) {
      if (auto ok = out.pad(offsets[i] - position); !ok)
        return ok;
      auto crc = out.write_hashed(bytes_of(dense[i].second));
      if (!crc)
        return crc.error();
      crcs[i] = *crc;
      position = offsets[i] + dense[i].second.nbytes();
    }
    if (auto ok = out.pad(payload_bytes - position); !ok)
      return ok;
    std::byte trailer[trailer_bytes];
    detail::store_field<std::uint32_t>(trailer, out.checksum());
    std::memcpy(trailer + 4, trailer_magic.data(), trailer_magic.size());
    return out.write(trailer);
  });
}

} // namespace

expected<std::vector<checkpoint_extent>>
save_checkpoint_with_extents(const std::filesystem::path& path, const named_tensors& tensors,
                             const checkpoint_metadata& metadata) {
  // Lay out payloads first: dense CPU tensors at 64-byte aligned offsets.
  named_tensors dense;
  dense.reserve(tensors.size());
  std::vector<std::uint64_t> offsets;
  std::uint64_t payload_bytes = 0;
  std::size_t name_bytes = 0;
  for (const auto& [name, value] : tensors) {
    if (!value.defined())
      return make_error(errc::invalid_argument, "save_checkpoint: tensor '{}' is undefined", name);
    if (value.where().kind != device_kind::cpu)
      return make_error(errc::invalid_argument,
                        "save_checkpoint: tensor '{}' is on {}; move it to the CPU first", name,
                        value.where());
    dense.emplace_back(name, value.contiguous());
    payload_bytes = align_up(payload_bytes);
    offsets.push_back(payload_bytes);
    payload_bytes += dense.back().second.nbytes();
    name_bytes += name.size();
  }
  payload_bytes = align_up(payload_bytes);

  std::vector<std::uint64_t> index;
  try {
    capnp::MallocMessageBuilder builder(
        static_cast<unsigned>(std::min<std::size_t>(64 + tensors.size() * 24 + name_bytes / 8,
                                                     std::size_t{1} << 26)));
    auto root = builder.initRoot<wire::CheckpointIndex>();
    auto entries = root.initEntries(static_cast<unsigned>(dense.size()));
    for (unsigned i = 0; i < dense.size(); ++i) {
      const auto& [name, value] = dense[i];
      auto entry = entries[i];
      entry.setName(capnp::Text::Reader(name.data(), name.size()));
      detail::write_tensor_header(entry.initTensor(),
                                  {value.type(), value.shape(), contiguous_strides(value.shape()),
                                   value.nbytes(), device::cpu()});
      entry.setPayloadOffset(offsets[i]);
    }
    auto pairs = root.initMetadata(static_cast<unsigned>(metadata.size()));
    for (unsigned i = 0; i < metadata.size(); ++i) {
      pairs[i].setKey(capnp::Text::Reader(metadata[i].first.data(), metadata[i].first.size()));
      pairs[i].setValue(capnp::Text::Reader(metadata[i].second.data(), metadata[i].second.size()));
    }
    index = detail::flatten(builder);
  } catch (const kj::Exception& e) {
    return make_error(errc::invalid_argument, "save_checkpoint: cannot build the index: {}",
                      e.getDescription().cStr());
  }
  // Each payload's checksum, computed as it is written: the extents report
  // it and the file's own checksum combines them.
  std::vector<std::uint32_t> crcs(dense.size());
  if (auto ok = write_file(path, dense, index, offsets, crcs, payload_bytes); !ok)
    return ok.error();
  std::vector<checkpoint_extent> extents;
  extents.reserve(dense.size());
  auto payload_start = align_up(preamble_bytes + index.size() * 8);
  for (std::size_t i = 0; i < dense.size(); ++i)
    extents.push_back({payload_start + offsets[i], dense[i].second.nbytes(), crcs[i]});
  return extents;
}

expected<void> save_checkpoint(const std::filesystem::path& path, const named_tensors& tensors,
                               const checkpoint_metadata& metadata) {
  auto extents = save_checkpoint_with_extents(path, tensors, metadata);
  if (!extents)
    return extents.error();
  return {};
}

expected<checkpoint_contents> parse_checkpoint(std::shared_ptr<storage> file,
                                               const checkpoint_options& options) {
  if (!file)
    return make_error(errc::invalid_argument, "parse_checkpoint: null storage");
  std::span<const std::byte> bytes(static_cast<const std::byte*>(file->data()), file->bytes());
  auto sizes = check_preamble(bytes.first(std::min<std::size_t>(bytes.size(), preamble_bytes)),
                              bytes.size(), options);
  if (!sizes)
    return sizes.error();
  auto body = detail::checked_body(bytes, trailer_magic, "checkpoint");
  if (!body)
    return body.error();

  auto index_frame = body->subspan(preamble_bytes, sizes->index_bytes);
  auto payload_start = sizes->payload_start;
  return detail::with_frame(
      index_frame, static_cast<std::size_t>(options.max_index_bytes),
      [&](capnp::MessageReader& reader) -> expected<checkpoint_contents> {
        auto root = reader.getRoot<wire::CheckpointIndex>();
        auto entries = root.getEntries();
        if (entries.size() > options.max_entries)
          return make_error(errc::size_limit_exceeded, "checkpoint has {} tensors, above the limit {}",
                            entries.size(), options.max_entries);
        checkpoint_contents out;
        out.tensors.reserve(entries.size());
        std::unordered_set<std::string> seen;
        for (unsigned i = 0; i < entries.size(); ++i) {
          auto entry = entries[i];
          auto text = entry.getName();
          std::string name(text.cStr(), text.size());
          if (!seen.insert(name).second)
            return make_error(errc::malformed_message, "tensor '{}' appears twice", name);
          auto layout = detail::read_tensor_header(
              entry.getTensor(), {options.max_tensor_bytes, options.max_rank});
          if (!layout)
            return make_error(layout.error().code(), "tensor '{}': {}", name,
                              layout.error().message());
          auto offset = entry.getPayloadOffset();
          auto element = size_of(layout->type);
          if (offset > sizes->payload_bytes || layout->byte_count > sizes->payload_bytes - offset)
            return make_error(errc::malformed_message,
                              "tensor '{}': payload [{}, +{}) is outside the {}-byte payload region",
                              name, offset, layout->byte_count, sizes->payload_bytes);
          if ((payload_start + offset) % element != 0)
            return make_error(errc::malformed_message,
                              "tensor '{}': payload offset {} is not aligned to {} bytes", name,
                              offset, element);
          auto first_element = static_cast<std::int64_t>((payload_start + offset) / element);
          out.tensors.emplace_back(std::move(name),
                                   tensor::from_storage(file, layout->shape, layout->strides,
                                                        first_element, layout->type));
        }
        auto pairs = root.getMetadata();
        for (auto pair : pairs) {
          auto key = pair.getKey();
          auto value = pair.getValue();
          out.metadata.emplace_back(std::string(key.cStr(), key.size()),
                                    std::string(value.cStr(), value.size()));
        }
        return out;
      });
}

expected<checkpoint_contents> parse_checkpoint(std::span<const std::byte> file,
                                               const checkpoint_options& options) {
  // Check the preamble before allocating a copy.
  auto sizes = check_preamble(file.first(std::min<std::size_t>(file.size(), preamble_bytes)),
                              file.size(), options);
  if (!sizes)
    return sizes.error();
  auto copy = storage::allocate(file.size());
  std::memcpy(copy->data(), file.data(), file.size());
  return parse_checkpoint(std::move(copy), options);
}

expected<checkpoint_contents> read_checkpoint(const std::filesystem::path& path,
                                              const checkpoint_options& options) {
  auto file = detail::read_only_file::open(path);
  if (!file)
    return file.error();
  // Sizes against the file length before allocating the file's buffer.
  std::byte head[preamble_bytes] = {};
  auto head_bytes = std::min<std::uint64_t>(file->size(), preamble_bytes);
  if (auto ok = file->read(head, head_bytes, 0); !ok)
    return ok.error();
  auto sizes = check_preamble(std::span(head, head_bytes), file->size(), options);
  if (!sizes)
    return make_error(sizes.error().code(), "{}: {}", path.string(), sizes.error().message());

  auto buffer = storage::allocate(file->size());
  if (auto ok = file->read(static_cast<std::byte*>(buffer->data()), file->size(), 0); !ok)
    return ok.error();
  auto parsed = parse_checkpoint(std::move(buffer), options);
  if (!parsed)
    return make_error(parsed.error().code(), "{}: {}", path.string(), parsed.error().message());
  return parsed;
}

expected<named_tensors> load_checkpoint(const std::filesystem::path& path,
                                        const checkpoint_options& options) {
  auto contents = read_checkpoint(path, options);
  if (!contents)
    return contents.error();
  return std::move(contents->tensors);
}

} // namespace troupe
