#include "troupe/serialization/checkpoint_manifest.hpp"

#include <cstring>
#include <string_view>

#include "checkpoint_layout.hpp"
#include "durable_file.hpp"
#include "troupe/serialization/checksum.hpp"
#include "wire.hpp"

namespace troupe {

namespace {

// File layout: see checkpoint_manifest.hpp.
constexpr std::string_view file_magic{"TROUPEMF", 8};
constexpr std::string_view trailer_magic{"MEND", 4};
constexpr std::uint32_t format_version = 1;
constexpr std::uint64_t preamble_bytes = 24;
constexpr std::uint64_t trailer_bytes = 8;

/// Checks magic, version and the frame size against the file length; needs
/// only the first 24 bytes.
expected<std::uint64_t> check_preamble(std::span<const std::byte> head, std::uint64_t file_bytes,
                                       const manifest_options& options) {
  if (file_bytes < preamble_bytes + trailer_bytes)
    return make_error(errc::malformed_message, "manifest is {} bytes, shorter than the {}-byte minimum",
                      file_bytes, preamble_bytes + trailer_bytes);
  if (std::memcmp(head.data(), file_magic.data(), file_magic.size()) != 0)
    return make_error(errc::malformed_message, "not a troupe checkpoint manifest (wrong magic)");
  auto version = detail::load_field<std::uint32_t>(head.data() + 8);
  if (version != format_version)
    return make_error(errc::malformed_message, "manifest version is {} but must be {}", version,
                      format_version);
  auto frame_bytes = detail::load_field<std::uint64_t>(head.data() + 16);
  if (frame_bytes % 8 != 0 || frame_bytes > options.max_manifest_bytes)
    return make_error(errc::size_limit_exceeded, "manifest frame is {} bytes but must be a multiple of 8 in [8, {}]",
                      frame_bytes, options.max_manifest_bytes);
  if (frame_bytes != file_bytes - preamble_bytes - trailer_bytes)
    return make_error(errc::malformed_message,
                      "manifest frame ({} bytes) disagrees with the file length {} (truncated or extended?)",
                      frame_bytes, file_bytes);
  return frame_bytes;
}

template <class List> void set_dims(List list, const dims& values) {
  for (unsigned d = 0; d < values.size(); ++d)
    list.set(d, values[d]);
}

/// A dims list of at most `max_rank` entries.
expected<dims> read_dims(capnp::List<std::int64_t>::Reader list, std::uint32_t max_rank,
                         std::string_view what, std::string_view name) {
  if (list.size() > max_rank)
    return make_error(errc::size_limit_exceeded, "tensor '{}': {} has {} dimensions, above the limit {}", name,
                      what, list.size(), max_rank);
  dims out;
  out.reserve(list.size());
  for (auto value : list)
    out.push_back(value);
  return out;
}

std::string text_of(capnp::Text::Reader text) { return {text.cStr(), text.size()}; }

expected<checkpoint_tensor> read_tensor(wire::ManifestTensor::Reader entry, const manifest_options& options) {
  checkpoint_tensor out;
  out.name = text_of(entry.getName());
  auto type = dtype_from_wire(entry.getDtype());
  if (!type)
    return make_error(errc::unsupported_dtype, "tensor '{}': dtype {} is not one troupe knows", out.name,
                      entry.getDtype());
  out.type = *type;
  auto global = read_dims(entry.getGlobalShape(), options.max_rank, "the global shape", out.name);
  if (!global)
    return global.error();
  out.global_shape = std::move(*global);
  auto pieces = entry.getPieces();
  if (pieces.size() > options.max_pieces)
    return make_error(errc::size_limit_exceeded, "tensor '{}' has {} pieces, above the limit {}", out.name,
                      pieces.size(), options.max_pieces);
  out.pieces.reserve(pieces.size());
  for (auto piece : pieces) {
    auto offset = read_dims(piece.getOffset(), options.max_rank, "a piece's offset", out.name);
    if (!offset)
      return offset.error();
    auto shape = read_dims(piece.getShape(), options.max_rank, "a piece's shape", out.name);
    if (!shape)
      return shape.error();
    out.pieces.push_back({std::move(*offset), std::move(*shape), text_of(piece.getFile()), piece.getByteOffset(),
                          piece.getByteCount(), piece.getCrc32c()});
  }
  return out;
}

} // namespace

std::vector<std::byte> encode_manifest(const checkpoint_manifest& manifest) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::CheckpointManifest>();
  root.setStep(manifest.step);
  auto tensors = root.initTensors(static_cast<unsigned>(manifest.tensors.size()));
  for (unsigned i = 0; i < manifest.tensors.size(); ++i) {
    const auto& t = manifest.tensors[i];
    auto entry = tensors[i];
    entry.setName(capnp::Text::Reader(t.name.data(), t.name.size()));
    entry.setDtype(static_cast<std::uint8_t>(t.type));
    set_dims(entry.initGlobalShape(static_cast<unsigned>(t.global_shape.size())), t.global_shape);
    auto pieces = entry.initPieces(static_cast<unsigned>(t.pieces.size()));
    for (unsigned p = 0; p < t.pieces.size(); ++p) {
      const auto& piece = t.pieces[p];
      set_dims(pieces[p].initOffset(static_cast<unsigned>(piece.offset.size())), piece.offset);
      set_dims(pieces[p].initShape(static_cast<unsigned>(piece.shape.size())), piece.shape);
      pieces[p].setFile(capnp::Text::Reader(piece.file.data(), piece.file.size()));
      pieces[p].setByteOffset(piece.byte_offset);
      pieces[p].setByteCount(piece.byte_count);
      pieces[p].setCrc32c(piece.crc32c);
    }
  }
  auto metadata = root.initMetadata(static_cast<unsigned>(manifest.metadata.size()));
  for (unsigned i = 0; i < manifest.metadata.size(); ++i) {
    const auto& [key, value] = manifest.metadata[i];
    metadata[i].setKey(capnp::Text::Reader(key.data(), key.size()));
    metadata[i].setValue(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(value.data()), value.size()));
  }
  auto frame = detail::flatten(builder);
  auto frame_bytes = std::as_bytes(std::span(frame));

  std::vector<std::byte> file(preamble_bytes + frame_bytes.size() + trailer_bytes);
  std::memcpy(file.data(), file_magic.data(), file_magic.size());
  detail::store_field<std::uint32_t>(file.data() + 8, format_version);
  detail::store_field<std::uint64_t>(file.data() + 16, frame_bytes.size());
  std::memcpy(file.data() + preamble_bytes, frame_bytes.data(), frame_bytes.size());
  auto body = std::span(file).first(preamble_bytes + frame_bytes.size());
  detail::store_field<std::uint32_t>(file.data() + body.size(), crc32c(0, body));
  std::memcpy(file.data() + body.size() + 4, trailer_magic.data(), trailer_magic.size());
  return file;
}

expected<checkpoint_manifest> parse_manifest(std::span<const std::byte> file, const manifest_options& options) {
  auto frame_bytes = check_preamble(file.first(std::min<std::size_t>(file.size(), preamble_bytes)),
                                    file.size(), options);
  if (!frame_bytes)
    return frame_bytes.error();
  auto body = detail::checked_body(file, trailer_magic, "manifest");
  if (!body)
    return body.error();

  auto parsed = detail::with_frame(
      body->subspan(preamble_bytes), static_cast<std::size_t>(options.max_manifest_bytes),
      [&](capnp::MessageReader& reader) -> expected<checkpoint_manifest> {
        auto root = reader.getRoot<wire::CheckpointManifest>();
        checkpoint_manifest out;
        out.step = root.getStep();
        auto tensors = root.getTensors();
        if (tensors.size() > options.max_tensors)
          return make_error(errc::size_limit_exceeded, "manifest has {} tensors, above the limit {}",
                            tensors.size(), options.max_tensors);
        out.tensors.reserve(tensors.size());
        for (auto entry : tensors) {
          auto t = read_tensor(entry, options);
          if (!t)
            return t.error();
          out.tensors.push_back(std::move(*t));
        }
        for (auto pair : root.getMetadata()) {
          auto value = pair.getValue();
          out.metadata.emplace_back(text_of(pair.getKey()),
                                    std::string(reinterpret_cast<const char*>(value.begin()), value.size()));
        }
        return out;
      });
  if (!parsed)
    return parsed;
  if (auto ok = detail::validate_manifest(*parsed, options); !ok)
    return ok.error();
  return parsed;
}

expected<checkpoint_manifest> read_manifest(const std::filesystem::path& path, const manifest_options& options) {
  auto file = detail::read_only_file::open(path);
  if (!file)
    return file.error();
  auto with_path = [&](const error& e) { return error(e.code(), fmt::format("{}: {}", path.string(), e.message())); };
  std::byte head[preamble_bytes] = {};
  auto head_bytes = std::min<std::uint64_t>(file->size(), preamble_bytes);
  if (auto ok = file->read(head, head_bytes, 0); !ok)
    return ok.error();
  if (auto sizes = check_preamble(std::span(head, head_bytes), file->size(), options); !sizes)
    return with_path(sizes.error());
  std::vector<std::byte> bytes(file->size());
  if (auto ok = file->read(bytes.data(), bytes.size(), 0); !ok)
    return ok.error();
  auto parsed = parse_manifest(bytes, options);
  if (!parsed)
    return with_path(parsed.error());
  return parsed;
}

} // namespace troupe
