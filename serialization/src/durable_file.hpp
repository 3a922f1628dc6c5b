#pragma once
// Private file plumbing shared by checkpoint files, shard files and
// manifests: atomic writes (temporary file, fsync, rename, fsync of the
// directory) and bounded reads. Every OS failure becomes errc::io_error
// naming the path and the OS's reason.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <utility>

#include "troupe/tensor/expected.hpp"

namespace troupe::detail {

/// errc::io_error "<what> '<path>': <strerror(errno)>".
error os_error(std::string_view what, const std::filesystem::path& path);

/// Where an atomic write puts its bytes; keeps a running CRC32C of them.
class file_sink {
public:
  file_sink(int fd, const std::filesystem::path& path) : fd_(fd), path_(path) {}

  expected<void> write(std::span<const std::byte> bytes);
  /// Writes `bytes` and returns their own CRC32C (a payload's, for its
  /// extent), hashing each part of `hashed_part_bytes` right before it is
  /// written, while it is in cache; the running checksum combines it once.
  expected<std::uint32_t> write_hashed(std::span<const std::byte> bytes);
  static constexpr std::size_t hashed_part_bytes = std::size_t{1} << 20;
  /// `count` zero bytes (count < 64).
  expected<void> pad(std::size_t count);
  /// CRC32C of everything written so far.
  std::uint32_t checksum() const noexcept { return crc_; }
  /// Bytes written so far.
  std::uint64_t position() const noexcept { return position_; }

  /// Written bytes are handed to the disk (writeback started, not waited
  /// for) every this many bytes, so the disk writes while the rest is still
  /// being produced and the closing fsync finds little left to do; without
  /// it the kernel starts writeback only once the dirty pages pass its
  /// threshold (a tenth of memory), and a slower producer leaves the disk
  /// idle until the fsync.
  static constexpr std::uint64_t writeback_every = std::uint64_t{8} << 20;

private:
  /// Writes `bytes`; the checksum is the caller's business.
  expected<void> write_unchecked(std::span<const std::byte> bytes);

  int fd_;
  const std::filesystem::path& path_;
  std::uint32_t crc_ = 0;
  std::uint64_t position_ = 0;
  std::uint64_t handed_to_disk_ = 0; ///< bytes before this offset are under writeback
};

/// Creates `path` atomically: `produce` writes the bytes to `path.tmp`,
/// which is fsynced, renamed onto `path`, and the directory fsynced. On any
/// failure the temporary file is removed and `path` is untouched.
expected<void> write_file_atomically(const std::filesystem::path& path,
                                     const std::function<expected<void>(file_sink&)>& produce);

/// fsync of a directory, so that renames and creations in it are durable.
expected<void> fsync_directory(const std::filesystem::path& directory);

/// A regular file open for reading, closed on destruction.
class read_only_file {
public:
  /// Opens `path`; an error if it is missing, unreadable or not a regular file.
  static expected<read_only_file> open(const std::filesystem::path& path);

  read_only_file(read_only_file&& other) noexcept;
  read_only_file& operator=(read_only_file&&) = delete;
  ~read_only_file();

  std::uint64_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return path_; }
  /// Exactly `count` bytes at offset `at` into `into`.
  expected<void> read(std::byte* into, std::uint64_t count, std::uint64_t at) const;
  /// Tells the kernel that `count` bytes at `at` will be read soon, so it
  /// starts reading them from the disk now (a hint: nothing fails).
  void will_read(std::uint64_t count, std::uint64_t at) const noexcept;

private:
  read_only_file(int fd, std::filesystem::path path, std::uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {}

  int fd_ = -1;
  std::filesystem::path path_;
  std::uint64_t size_ = 0;
};

/// The bytes before an 8-byte trailer (CRC32C of those bytes, u32, then the
/// 4-byte `magic`), after checking it; `what` names the file kind in errors
/// ("checkpoint checksum is ... but the contents hash to ..."). `file` must
/// hold at least 8 bytes.
expected<std::span<const std::byte>> checked_body(std::span<const std::byte> file, std::string_view magic,
                                                 std::string_view what);

/// Little-endian loads and stores of file fields.
template <class T> T load_field(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
template <class T> void store_field(std::byte* p, T value) { std::memcpy(p, &value, sizeof value); }

} // namespace troupe::detail
