#include "troupe/serialization/safetensors.hpp"

#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "durable_file.hpp"

namespace troupe {

namespace {

std::string_view safetensors_dtype(dtype type) {
  switch (type) {
  case dtype::float32: return "F32";
  case dtype::float64: return "F64";
  case dtype::int64: return "I64";
  case dtype::int32: return "I32";
  case dtype::uint8: return "U8";
  case dtype::bfloat16: return "BF16";
  }
  return "?";
}

/// Whether `text` is UTF-8 that Python's strict decoder accepts (JSON
/// strings must be): no stray continuation bytes, overlong or out-of-range
/// lead bytes, or surrogates.
bool is_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    auto c = static_cast<unsigned char>(text[i]);
    std::size_t extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 4;
    if (extra == 4 || c == 0xC0 || c == 0xC1 || c > 0xF4 || text.size() - i <= extra)
      return false;
    for (std::size_t k = 1; k <= extra; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80)
        return false;
    auto next = static_cast<unsigned char>(extra > 0 ? text[i + 1] : 0);
    if ((c == 0xE0 && next < 0xA0) || (c == 0xED && next >= 0xA0) || (c == 0xF0 && next < 0x90) ||
        (c == 0xF4 && next >= 0x90))
      return false;
    i += extra + 1;
  }
  return true;
}

std::string hex(std::string_view bytes) {
  std::string out;
  for (char c : bytes)
    out += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return out;
}

/// A JSON string literal of UTF-8 `text`.
std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += {'\\', c};
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    else
      out += c;
  }
  return out + "\"";
}

} // namespace

expected<void> save_safetensors(const std::filesystem::path& path, const named_tensors& tensors,
                                const checkpoint_metadata& metadata) {
  named_tensors dense;
  std::set<std::string_view> names;
  std::string header = "{";
  std::uint64_t position = 0;
  for (const auto& [name, value] : tensors) {
    if (!value.defined() || value.where().kind != device_kind::cpu)
      return make_error(errc::invalid_argument, "save_safetensors: tensor '{}' is undefined or not on the CPU", name);
    if (!is_utf8(name) || name == "__metadata__" || !names.insert(name).second)
      return make_error(errc::invalid_argument, "save_safetensors: tensor name '{}' is given twice, reserved or not UTF-8",
                        name);
    dense.emplace_back(name, value.contiguous());
    header += fmt::format("{}{}: {{\"dtype\": \"{}\", \"shape\": [{}], \"data_offsets\": [{}, {}]}}",
                          header.size() > 1 ? ", " : "", json_string(name), safetensors_dtype(value.type()),
                          fmt::join(value.shape(), ", "), position, position + value.nbytes());
    position += value.nbytes();
  }
  if (!metadata.empty()) {
    header += fmt::format("{}\"__metadata__\": {{", header.size() > 1 ? ", " : "");
    for (std::size_t i = 0; i < metadata.size(); ++i) {
      const auto& [key, value] = metadata[i];
      auto text = is_utf8(value) ? value : hex(value);
      auto name = is_utf8(value) ? key : key + ".hex";
      if (!is_utf8(name))
        return make_error(errc::invalid_argument, "save_safetensors: metadata key '{}' is not UTF-8", key);
      header += fmt::format("{}{}: {}", i > 0 ? ", " : "", json_string(name), json_string(text));
    }
    header += "}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  return detail::write_file_atomically(path, [&](detail::file_sink& out) -> expected<void> {
    std::byte length[8];
    detail::store_field<std::uint64_t>(length, header.size());
    if (auto ok = out.write(length); !ok)
      return ok;
    if (auto ok = out.write(std::as_bytes(std::span(header))); !ok)
      return ok;
    for (const auto& [name, value] : dense)
      if (auto ok = out.write({static_cast<const std::byte*>(value.raw_data()), value.nbytes()}); !ok)
        return ok;
    return {};
  });
}

} // namespace troupe
