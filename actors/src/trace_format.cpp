#include "troupe/actors/trace_format.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace troupe::trace {

std::string_view name_of(event_type type) {
  switch (type) {
  case event_type::message_received: return "message_received";
  case event_type::message_sent: return "message_sent";
  case event_type::handler_start: return "handler_start";
  case event_type::handler_end: return "handler_end";
  case event_type::data_write: return "data_write";
  case event_type::data_read: return "data_read";
  case event_type::span_begin: return "span_begin";
  case event_type::span_end: return "span_end";
  case event_type::counter: return "counter";
  case event_type::clock_offset: return "clock_offset";
  case event_type::clock_sync: return "clock_sync";
  case event_type::dropped: return "dropped";
  }
  return "unknown";
}

namespace {

// Slicing-by-8 (Intel's, as in zlib and the Linux kernel): table k maps a
// byte to its CRC shifted by k more zero bytes, so eight bytes cost eight
// lookups and no loop-carried dependency per byte. The flush thread CRCs
// every chunk; byte-at-a-time it was most of the recorder's cost at
// 10^5 records/s (bench/transport, "tracing on" rows).
using crc_tables = std::array<std::array<std::uint32_t, 256>, 8>;
constexpr crc_tables make_crc_tables() {
  crc_tables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::uint32_t i = 0; i < 256; ++i)
      t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  return t;
}
constexpr auto crc_table = make_crc_tables();

template <class T> void put(std::string& out, std::size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

std::span<const std::byte> as_bytes(const std::string& s, std::size_t offset, std::size_t n) {
  return {reinterpret_cast<const std::byte*>(s.data()) + offset, n};
}

} // namespace

std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc) {
  static_assert(std::endian::native == std::endian::little, "slicing-by-8 as written assumes little endian");
  crc = ~crc;
  auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  auto n = bytes.size();
  const auto& t = crc_table;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
          t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p)
    crc = t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
  return ~crc;
}

file_writer::file_writer(file_writer&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), sequence_(other.sequence_),
      bytes_written_(other.bytes_written_), path_(std::move(other.path_)),
      buffer_(std::move(other.buffer_)) {}

file_writer& file_writer::operator=(file_writer&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    sequence_ = other.sequence_;
    bytes_written_ = other.bytes_written_;
    path_ = std::move(other.path_);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

file_writer::~file_writer() { close(); }

void file_writer::close() {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
}

namespace {

// Writes all of `bytes`; a short write is continued, EINTR retried.
expected<void> write_all(int fd, const std::string& path, std::string_view bytes) {
  while (!bytes.empty()) {
    auto n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return make_error(errc::io_error, "trace: cannot write {}: {}", path, std::strerror(errno));
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

} // namespace

expected<file_writer> file_writer::create(const std::string& path, const file_header& header) {
  file_writer w;
  w.path_ = path;
  w.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0)
    return make_error(errc::io_error, "trace: cannot create {}: {}", path, std::strerror(errno));
  std::string h(file_header_bytes, '\0');
  std::memcpy(h.data(), file_magic, sizeof file_magic);
  put<std::uint32_t>(h, 8, file_version);
  put<std::uint32_t>(h, 12, static_cast<std::uint32_t>(file_header_bytes));
  put<std::uint32_t>(h, 16, static_cast<std::uint32_t>(sizeof(record)));
  put<std::uint32_t>(h, 20, header.pid);
  put<std::uint64_t>(h, 24, header.flow_prefix);
  put<std::int64_t>(h, 32, header.wall_ns);
  put<std::int64_t>(h, 40, header.mono_ns);
  std::memcpy(h.data() + 48, header.node.data(), std::min<std::size_t>(header.node.size(), 63));
  put<std::uint32_t>(h, 124, crc32(as_bytes(h, 0, 124)));
  if (auto ok = write_all(w.fd_, path, h); !ok)
    return ok.error();
  w.bytes_written_ = h.size();
  return w;
}

expected<void> file_writer::write_chunk(std::span<const string_entry> strings,
                                        std::span<const record> records) {
  if (fd_ < 0)
    return make_error(errc::io_error, "trace: {} is closed", path_);
  // Assemble the whole chunk first so that it goes out in one write(): a
  // reader sees either all of it or a torn tail it can recognise.
  std::size_t string_bytes = 0;
  for (const auto& s : strings)
    string_bytes += 8 + ((std::min(s.text.size(), max_string_bytes) + 7) & ~std::size_t{7});
  std::size_t payload = string_bytes + records.size_bytes();
  buffer_.assign(chunk_header_bytes + payload, '\0');
  std::size_t at = chunk_header_bytes;
  for (const auto& s : strings) {
    auto n = std::min(s.text.size(), max_string_bytes);
    put<std::uint32_t>(buffer_, at, s.id);
    put<std::uint32_t>(buffer_, at + 4, static_cast<std::uint32_t>(n));
    std::memcpy(buffer_.data() + at + 8, s.text.data(), n);
    at += 8 + ((n + 7) & ~std::size_t{7});
  }
  if (!records.empty())
    std::memcpy(buffer_.data() + at, records.data(), records.size_bytes());
  put<std::uint32_t>(buffer_, 0, chunk_magic);
  put<std::uint32_t>(buffer_, 4, sequence_);
  put<std::uint32_t>(buffer_, 8, static_cast<std::uint32_t>(payload));
  put<std::uint32_t>(buffer_, 12, static_cast<std::uint32_t>(strings.size()));
  put<std::uint32_t>(buffer_, 16, static_cast<std::uint32_t>(string_bytes));
  put<std::uint32_t>(buffer_, 20, static_cast<std::uint32_t>(records.size()));
  put<std::uint32_t>(buffer_, 24, crc32(as_bytes(buffer_, chunk_header_bytes, payload)));
  put<std::uint32_t>(buffer_, 28, crc32(as_bytes(buffer_, 0, 28)));
  if (auto ok = write_all(fd_, path_, buffer_); !ok)
    return ok;
  ++sequence_;
  bytes_written_ += buffer_.size();
  return {};
}

} // namespace troupe::trace
