#include "durable_file.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "troupe/serialization/checksum.hpp"

namespace troupe::detail {

error os_error(std::string_view what, const std::filesystem::path& path) {
  return make_error(errc::io_error, "{} '{}': {}", what, path.string(), std::strerror(errno));
}

expected<std::uint32_t> file_sink::write_hashed(std::span<const std::byte> bytes) {
  std::uint32_t crc = 0;
  for (std::size_t done = 0; done < bytes.size();) {
    auto part = bytes.subspan(done, std::min(hashed_part_bytes, bytes.size() - done));
    crc = crc32c(crc, part);
    if (auto ok = write_unchecked(part); !ok)
      return ok.error();
    done += part.size();
  }
  crc_ = crc32c_combine(crc_, crc, bytes.size());
  return crc;
}

expected<void> file_sink::write(std::span<const std::byte> bytes) {
  crc_ = crc32c(crc_, bytes);
  return write_unchecked(bytes);
}

namespace {

/// The environment variable `name`, or `fallback` when it is unset.
std::string_view environment_or(const char* name, std::string_view fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string_view(value) : fallback;
}

/// The test hook TROUPE_CHECKPOINT_TEST_KILL_AFTER_BYTES=<n>: a process
/// writing a shard file (`*.shard`) past its n-th byte writes the first n
/// and kills itself with SIGKILL, leaving the file half written, as a rank
/// killed in the middle of a save would (tests/parallel/checkpoints_test.cpp).
/// In a job, TROUPE_CHECKPOINT_TEST_KILL_RANK=<r> limits it to rank r in
/// the job's first run (not after troupe-launch --restarts), and
/// TROUPE_CHECKPOINT_TEST_KILL_STEP=<s> to the save of step s
/// (examples/check_restart.sh).
/// How many bytes of `bytes` to write before that, or nullopt to write all.
std::optional<std::size_t> bytes_before_kill(const std::filesystem::path& path, std::uint64_t at,
                                             std::span<const std::byte> bytes) {
  const char* limit = std::getenv("TROUPE_CHECKPOINT_TEST_KILL_AFTER_BYTES");
  if (limit == nullptr || path.filename().string().find(".shard") == std::string::npos)
    return std::nullopt;
  if (const char* rank = std::getenv("TROUPE_CHECKPOINT_TEST_KILL_RANK");
      rank != nullptr && (environment_or("TROUPE_RANK", "0") != rank || environment_or("TROUPE_RESTART", "0") != "0"))
    return std::nullopt;
  if (const char* step = std::getenv("TROUPE_CHECKPOINT_TEST_KILL_STEP");
      step != nullptr && path.parent_path().filename().string() != "step-" + std::string(step) + ".tmp")
    return std::nullopt;
  const auto n = std::strtoull(limit, nullptr, 10);
  if (at + bytes.size() <= n)
    return std::nullopt;
  return static_cast<std::size_t>(n > at ? n - at : 0);
}

} // namespace

expected<void> file_sink::write_unchecked(std::span<const std::byte> bytes) {
  if (auto before = bytes_before_kill(path_, position_, bytes)) {
    auto part = bytes.first(*before);
    while (!part.empty()) {
      auto written = ::write(fd_, part.data(), part.size());
      if (written <= 0)
        break;
      part = part.subspan(static_cast<std::size_t>(written));
    }
    std::raise(SIGKILL);
  }
  position_ += bytes.size();
  while (!bytes.empty()) {
    auto written = ::write(fd_, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR)
        continue;
      return os_error("cannot write", path_);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
  if (position_ - handed_to_disk_ >= writeback_every) {
    // Only a hint: a file system without it still gets the closing fsync.
    static_cast<void>(::sync_file_range(fd_, static_cast<off_t>(handed_to_disk_),
                                        static_cast<off_t>(position_ - handed_to_disk_), SYNC_FILE_RANGE_WRITE));
    handed_to_disk_ = position_;
  }
  return {};
}

expected<void> file_sink::pad(std::size_t count) {
  static constexpr std::byte zeros[64] = {};
  TROUPE_ASSERT(count <= sizeof zeros, "file_sink::pad({}) above 64 bytes", count);
  return write(std::span(zeros, count));
}

namespace {

/// Closes the descriptor and, unless kept, unlinks the temporary file.
struct temporary_file {
  int fd = -1;
  std::filesystem::path path;
  bool keep = false;
  ~temporary_file() {
    if (fd >= 0)
      ::close(fd);
    if (!keep && !path.empty())
      ::unlink(path.c_str());
  }
};

} // namespace

expected<void> write_file_atomically(const std::filesystem::path& path,
                                     const std::function<expected<void>(file_sink&)>& produce) {
  auto tmp_path = path;
  tmp_path += ".tmp";
  temporary_file tmp;
  tmp.fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0)
    return os_error("cannot create", tmp_path);
  tmp.path = tmp_path;
  file_sink sink(tmp.fd, tmp_path);
  if (auto ok = produce(sink); !ok)
    return ok;

  // Durable before visible: data, then the rename, then the directory entry.
  if (::fsync(tmp.fd) != 0)
    return os_error("cannot fsync", tmp_path);
  auto closed = ::close(tmp.fd);
  tmp.fd = -1;
  if (closed != 0)
    return os_error("cannot close", tmp_path);
  if (::rename(tmp_path.c_str(), path.c_str()) != 0)
    return os_error("cannot rename the temporary file onto", path);
  tmp.keep = true;
  return fsync_directory(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

expected<std::span<const std::byte>> checked_body(std::span<const std::byte> file, std::string_view magic,
                                                 std::string_view what) {
  auto body = file.first(file.size() - 8);
  auto trailer = file.last(8);
  if (std::memcmp(trailer.data() + 4, magic.data(), magic.size()) != 0)
    return make_error(errc::malformed_message, "{} trailer is missing (truncated?)", what);
  auto stored = load_field<std::uint32_t>(trailer.data());
  auto computed = crc32c(0, body);
  if (stored != computed)
    return make_error(errc::checksum_mismatch, "{} checksum is {:#010x} but the contents hash to {:#010x}", what,
                      stored, computed);
  return body;
}

expected<void> fsync_directory(const std::filesystem::path& directory) {
  int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return os_error("cannot open directory", directory);
  auto synced = ::fsync(fd);
  ::close(fd);
  if (synced != 0)
    return os_error("cannot fsync directory", directory);
  return {};
}

expected<read_only_file> read_only_file::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return os_error("cannot open", path);
  read_only_file file(fd, path, 0);
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    return os_error("cannot stat", path);
  if (!S_ISREG(info.st_mode))
    return make_error(errc::io_error, "'{}' is not a regular file", path.string());
  file.size_ = static_cast<std::uint64_t>(info.st_size);
  return file;
}

read_only_file::read_only_file(read_only_file&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), size_(other.size_) {}

read_only_file::~read_only_file() {
  if (fd_ >= 0)
    ::close(fd_);
}

expected<void> read_only_file::read(std::byte* into, std::uint64_t count, std::uint64_t at) const {
  while (count > 0) {
    auto got = ::pread(fd_, into, count, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return os_error("cannot read", path_);
    if (got == 0)
      return make_error(errc::io_error, "'{}' shrank while being read", path_.string());
    into += got;
    at += static_cast<std::uint64_t>(got);
    count -= static_cast<std::uint64_t>(got);
  }
  return {};
}

void read_only_file::will_read(std::uint64_t count, std::uint64_t at) const noexcept {
  (void)::posix_fadvise(fd_, static_cast<off_t>(at), static_cast<off_t>(count), POSIX_FADV_WILLNEED);
}

} // namespace troupe::detail
