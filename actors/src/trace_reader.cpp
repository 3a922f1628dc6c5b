#include "troupe/actors/trace_reader.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace troupe::trace {

namespace {

constexpr std::size_t max_listed_warnings = 10;
constexpr std::uint32_t max_string_id = 1u << 24;

template <class T> T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::span<const std::byte> bytes_of(const std::string& s, std::size_t offset, std::size_t n) {
  return {reinterpret_cast<const std::byte*>(s.data()) + offset, n};
}

// Collects per-record warnings, listing the first few and counting the rest.
struct record_warnings {
  std::vector<std::string>& out;
  std::uint64_t count = 0;
  template <class... Ts> void add(fmt::format_string<Ts...> f, Ts&&... args) {
    if (count++ < max_listed_warnings)
      out.push_back(fmt::format(f, std::forward<Ts>(args)...));
  }
};

} // namespace

const std::string& trace_file::name(std::uint32_t id) const {
  static const std::string none;
  auto it = strings.find(id);
  return it == strings.end() ? none : it->second;
}

expected<trace_file> read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(errc::io_error, "{}: cannot open: {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  auto size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  trace_file file;
  file.path = path;

  // File header: any damage here means we cannot trust anything after it.
  if (size < file_header_bytes)
    return make_error(errc::malformed_message,
                      "{}: file is {} bytes but a trace file header needs {}", path, size,
                      file_header_bytes);
  std::string h(file_header_bytes, '\0');
  in.read(h.data(), static_cast<std::streamsize>(h.size()));
  if (!in)
    return make_error(errc::io_error, "{}: cannot read the header", path);
  if (std::memcmp(h.data(), file_magic, sizeof file_magic) != 0)
    return make_error(errc::malformed_message, "{}: offset 0: bad magic (not a troupe trace file)",
                      path);
  if (auto v = get<std::uint32_t>(h.data() + 8); v != file_version)
    return make_error(errc::malformed_message, "{}: offset 8: version is {} but must be {}", path,
                      v, file_version);
  if (auto n = get<std::uint32_t>(h.data() + 12); n != file_header_bytes)
    return make_error(errc::malformed_message, "{}: offset 12: header size is {} but must be {}",
                      path, n, file_header_bytes);
  if (auto n = get<std::uint32_t>(h.data() + 16); n != sizeof(record))
    return make_error(errc::malformed_message, "{}: offset 16: record size is {} but must be {}",
                      path, n, sizeof(record));
  if (crc32(bytes_of(h, 0, 124)) != get<std::uint32_t>(h.data() + 124))
    return make_error(errc::checksum_mismatch, "{}: offset 124: header checksum mismatch", path);
  file.header.pid = get<std::uint32_t>(h.data() + 20);
  file.header.flow_prefix = get<std::uint64_t>(h.data() + 24);
  file.header.wall_ns = get<std::int64_t>(h.data() + 32);
  file.header.mono_ns = get<std::int64_t>(h.data() + 40);
  file.header.node.assign(h.data() + 48, strnlen(h.data() + 48, 63));

  // Chunks, until the end or the first damaged one (a torn tail after a
  // crash, or corruption: in both cases nothing after it can be framed).
  record_warnings bad_records{file.warnings};
  std::uint64_t offset = file_header_bytes;
  std::uint32_t expected_sequence = 0;
  std::string chunk;
  auto stop_reading = [&](std::string why) {
    file.warnings.push_back(fmt::format("{}: offset {}: {}; ignoring the remaining {} bytes", path,
                                        offset, why, size - offset));
  };
  while (offset < size) {
    auto remaining = size - offset;
    if (remaining < chunk_header_bytes) {
      stop_reading(fmt::format("torn chunk header ({} of {} bytes)", remaining, chunk_header_bytes));
      break;
    }
    chunk.resize(chunk_header_bytes);
    in.read(chunk.data(), chunk_header_bytes);
    if (!in) {
      stop_reading("read failed");
      break;
    }
    if (get<std::uint32_t>(chunk.data()) != chunk_magic) {
      stop_reading("bad chunk magic");
      break;
    }
    if (crc32(bytes_of(chunk, 0, 28)) != get<std::uint32_t>(chunk.data() + 28)) {
      stop_reading("chunk header checksum mismatch");
      break;
    }
    auto sequence = get<std::uint32_t>(chunk.data() + 4);
    std::uint64_t payload = get<std::uint32_t>(chunk.data() + 8);
    auto string_count = get<std::uint32_t>(chunk.data() + 12);
    std::uint64_t string_bytes = get<std::uint32_t>(chunk.data() + 16);
    std::uint64_t record_count = get<std::uint32_t>(chunk.data() + 20);
    if (payload > max_payload_bytes || string_bytes % 8 != 0 ||
        string_bytes + record_count * sizeof(record) != payload ||
        std::uint64_t{string_count} * 8 > string_bytes) {
      stop_reading(fmt::format("chunk sizes are inconsistent (payload {}, strings {} in {} bytes, "
                               "{} records); payload must be in [0, {}]",
                               payload, string_count, string_bytes, record_count,
                               max_payload_bytes));
      break;
    }
    if (payload > remaining - chunk_header_bytes) {
      stop_reading(fmt::format("torn chunk (payload {} bytes, {} present)", payload,
                               remaining - chunk_header_bytes));
      break;
    }
    chunk.resize(chunk_header_bytes + payload);
    in.read(chunk.data() + chunk_header_bytes, static_cast<std::streamsize>(payload));
    if (!in) {
      stop_reading("read failed");
      break;
    }
    if (crc32(bytes_of(chunk, chunk_header_bytes, payload)) != get<std::uint32_t>(chunk.data() + 24)) {
      stop_reading("chunk payload checksum mismatch");
      break;
    }
    if (sequence != expected_sequence)
      file.warnings.push_back(fmt::format("{}: offset {}: chunk sequence is {} but expected {}",
                                          path, offset, sequence, expected_sequence));
    expected_sequence = sequence + 1;

    // Strings.
    std::size_t at = chunk_header_bytes;
    std::size_t strings_end = chunk_header_bytes + string_bytes;
    bool strings_ok = true;
    for (std::uint32_t i = 0; i < string_count; ++i) {
      if (at + 8 > strings_end) {
        strings_ok = false;
        break;
      }
      auto id = get<std::uint32_t>(chunk.data() + at);
      auto length = get<std::uint32_t>(chunk.data() + at + 4);
      auto padded = (std::size_t{length} + 7) & ~std::size_t{7};
      if (id == 0 || id >= max_string_id || length > max_string_bytes ||
          at + 8 + padded > strings_end) {
        file.warnings.push_back(fmt::format(
            "{}: offset {}: string {} has id {} (must be in [1, {})) and length {} (must be in "
            "[0, {}] and fit the chunk); skipping the chunk's remaining strings",
            path, offset + at, i, id, max_string_id, length, max_string_bytes));
        strings_ok = false;
        break;
      }
      file.strings[id].assign(chunk.data() + at + 8, length);
      at += 8 + padded;
    }
    (void)strings_ok;

    // Records: check every field a report will index with.
    for (std::uint64_t i = 0; i < record_count; ++i) {
      auto record_offset = chunk_header_bytes + string_bytes + i * sizeof(record);
      record r;
      std::memcpy(&r, chunk.data() + record_offset, sizeof r);
      auto where = offset + record_offset;
      auto type = static_cast<std::uint8_t>(r.type);
      if (type == 0 || type > max_event_type) {
        bad_records.add("{}: offset {}: record type is {} but must be in [1, {}]; skipped", path,
                        where, type, max_event_type);
        continue;
      }
      bool ids_ok = true;
      for (auto [field, id] : {std::pair{"actor", r.actor}, {"peer", r.peer}, {"kind", r.kind}}) {
        if (id != 0 && !file.strings.contains(id)) {
          bad_records.add("{}: offset {}: {} string id {} is not defined (the file defines {} "
                          "strings so far); skipped",
                          path, where, field, id, file.strings.size());
          ids_ok = false;
          break;
        }
      }
      if (!ids_ok)
        continue;
      if (r.duration_ns < 0 && r.type != event_type::clock_offset) {
        bad_records.add("{}: offset {}: duration is {} ns but must be >= 0; skipped", path, where,
                        r.duration_ns);
        continue;
      }
      if (r.type == event_type::dropped)
        file.dropped += r.value;
      if (r.type == event_type::clock_offset) {
        auto uncertainty = r.duration_ns < 0 ? -r.duration_ns : r.duration_ns;
        if (!file.has_clock_offset || uncertainty < file.clock_uncertainty_ns) {
          file.has_clock_offset = true;
          file.clock_offset_ns = static_cast<std::int64_t>(r.value);
          file.clock_uncertainty_ns = uncertainty;
        }
      }
      file.records.push_back(r);
    }
    ++file.chunks;
    offset += chunk_header_bytes + payload;
  }
  if (bad_records.count > max_listed_warnings)
    file.warnings.push_back(fmt::format("{}: ... and {} more skipped records", path,
                                        bad_records.count - max_listed_warnings));
  return file;
}

expected<std::vector<trace_file>> read_trace_inputs(std::span<const std::string> paths,
                                                    std::vector<std::string>& warnings) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(p, ec)) {
        auto name = entry.path().filename().string();
        if (entry.is_regular_file() && name.starts_with("trace-") && name.ends_with(".bin"))
          found.push_back(entry.path().string());
      }
      if (ec)
        warnings.push_back(fmt::format("{}: cannot list: {}", p, ec.message()));
      if (found.empty())
        warnings.push_back(fmt::format("{}: no trace-*.bin files in this directory", p));
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(p);
    }
  }
  std::vector<trace_file> out;
  for (const auto& f : files) {
    auto file = read_trace_file(f);
    if (!file) {
      warnings.push_back(fmt::format("skipping {}", file.error().message()));
      continue;
    }
    for (const auto& w : file->warnings)
      warnings.push_back(w);
    out.push_back(std::move(*file));
  }
  if (out.empty())
    return make_error(errc::invalid_argument, "no readable trace files among the {} inputs",
                      files.size());
  return out;
}

} // namespace troupe::trace
