#include "troupe/actors/shared_arena.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <limits>
#include <iterator>
#include <cstring>
#include <map>
#include <mutex>

#include "troupe/serialization/decode.hpp"
#include "troupe/serialization/encoded_message.hpp"

namespace troupe::actors {

namespace {

constexpr std::uint64_t block = 64;
constexpr std::string_view name_prefix = "/troupe-";

std::uint64_t round_up(std::uint64_t bytes) { return (bytes + block - 1) / block * block; }

/// Names we create and accept: "/troupe-" then [A-Za-z0-9_.-], at most 255
/// bytes (NAME_MAX), so a peer cannot make us open anything else.
expected<void> check_name(const std::string& name) {
  if (name.size() <= name_prefix.size() || name.size() > 255 ||
      name.compare(0, name_prefix.size(), name_prefix) != 0)
    return make_error(errc::malformed_message,
                      "arena name '{}' must start with '{}' and be at most 255 bytes", name,
                      name_prefix);
  for (std::size_t i = 1; i < name.size(); ++i) {
    auto c = static_cast<unsigned char>(name[i]);
    if (!(std::isalnum(c) || c == '_' || c == '.' || c == '-'))
      return make_error(errc::malformed_message,
                        "arena name '{}' has character {:#x} at {}; allowed are [A-Za-z0-9_.-]",
                        name, static_cast<unsigned>(c), i);
  }
  return {};
}

} // namespace

// -- owner ---------------------------------------------------------------------

class shared_arena::state {
public:
  struct region {
    std::uint64_t length = 0;
    bool held_here = true; // a tensor of this process still views it
    std::uint32_t shared = 0; // handoffs not yet released
  };

  state(std::string name, int fd, void* base, std::size_t capacity)
      : name_(std::move(name)), fd_(fd), base_(static_cast<std::byte*>(base)),
        capacity_(capacity) {
    free_[0] = capacity;
  }
  ~state() {
    ::munmap(base_, capacity_);
    ::close(fd_);
  }

  expected<std::uint64_t> allocate(std::uint64_t bytes) {
    auto length = std::max(round_up(bytes), block);
    std::lock_guard guard(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < length)
        continue;
      auto offset = it->first;
      auto rest = it->second - length;
      free_.erase(it);
      if (rest > 0)
        free_[offset + length] = rest;
      regions_[offset] = region{length, true, 0};
      used_ += length;
      return offset;
    }
    return make_error(errc::size_limit_exceeded,
                      "arena '{}': no free region of {} bytes ({} of {} bytes in use)", name_,
                      length, used_, capacity_);
  }

  void drop_local(std::uint64_t offset) {
    std::lock_guard guard(mutex_);
    auto it = regions_.find(offset);
    if (it == regions_.end())
      return;
    it->second.held_here = false;
    if (it->second.shared == 0)
      free_region(it);
  }

  expected<arena_ref> share(const tensor& value) {
    auto* data = static_cast<std::byte*>(value.raw_data());
    if (data < base_ || data >= base_ + capacity_ || !value.is_contiguous())
      return make_error(errc::invalid_argument,
                        "arena '{}': share() needs a contiguous tensor allocated in this arena",
                        name_);
    auto offset = static_cast<std::uint64_t>(data - base_);
    std::lock_guard guard(mutex_);
    auto it = regions_.find(offset);
    if (it == regions_.end() || value.nbytes() > it->second.length)
      return make_error(errc::invalid_argument,
                        "arena '{}': the tensor at offset {} does not start an allocated region",
                        name_, offset);
    ++it->second.shared;
    return arena_ref{name_, offset, value.nbytes()};
  }

  expected<void> release(const arena_ref& ref) {
    std::lock_guard guard(mutex_);
    auto it = regions_.find(ref.offset);
    if (ref.arena != name_ || it == regions_.end() || it->second.shared == 0 ||
        ref.length > it->second.length)
      return make_error(errc::invalid_argument,
                        "arena '{}': release of region (offset {}, {} bytes) that is not shared",
                        name_, ref.offset, ref.length);
    if (--it->second.shared == 0 && !it->second.held_here)
      free_region(it);
    return {};
  }

  std::size_t used() const {
    std::lock_guard guard(mutex_);
    return used_;
  }
  std::size_t shared_regions() const {
    std::lock_guard guard(mutex_);
    std::size_t n = 0;
    for (auto& [offset, r] : regions_)
      n += r.shared > 0;
    return n;
  }

  const std::string name_;
  const int fd_;
  std::byte* const base_;
  const std::size_t capacity_;

private:
  /// Returns a region to the free list, merging it with free neighbours.
  void free_region(std::map<std::uint64_t, region>::iterator it) { // requires mutex_
    auto offset = it->first;
    auto length = it->second.length;
    used_ -= length;
    regions_.erase(it);
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == offset + length) {
      length += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == offset) {
        previous->second += length;
        return;
      }
    }
    free_[offset] = length;
  }

  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::uint64_t> free_; // offset -> length
  std::map<std::uint64_t, region> regions_;
  std::size_t used_ = 0;
};

std::string shared_arena::name_for(std::string_view job, std::string_view node) {
  std::string out(name_prefix);
  auto append = [&](std::string_view label) {
    for (char c : label)
      out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ? c : '_';
  };
  append(job);
  out += '-';
  append(node);
  return out.substr(0, 255);
}

namespace {

/// The pid in a router's arena name ("troupe-<hex>_<pid>-<node>", as listed
/// in /dev/shm), or 0 when the name is not one.
long pid_in_arena_name(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix))
    return 0;
  auto rest = name.substr(prefix.size());
  auto token_end = rest.find('_');
  if (token_end == 0 || token_end == std::string_view::npos ||
      !std::all_of(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(token_end),
                   [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
    return 0;
  auto digits = rest.substr(token_end + 1);
  auto pid_end = digits.find('-');
  if (pid_end == 0 || pid_end == std::string_view::npos || pid_end > 18)
    return 0;
  long pid = 0;
  for (char c : digits.substr(0, pid_end)) {
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return 0;
    pid = pid * 10 + (c - '0');
  }
  return pid;
}

/// Router-named arenas in /dev/shm ("/troupe-<hex>_<pid>-<node>"), by pid.
std::map<long, std::vector<std::string>> arena_names_by_pid(std::string_view prefix) {
  std::map<long, std::vector<std::string>> names;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir)
    return names;
  while (auto* entry = ::readdir(dir))
    if (auto pid = pid_in_arena_name(entry->d_name, prefix); pid > 0)
      names[pid].push_back("/" + std::string(entry->d_name));
  ::closedir(dir);
  return names;
}

std::size_t unlink_all(const std::vector<std::string>& names) {
  std::size_t removed = 0;
  for (const auto& name : names)
    removed += ::shm_unlink(name.c_str()) == 0;
  return removed;
}

} // namespace

std::size_t shared_arena::remove_left_by_gone_processes() {
  std::size_t removed = 0;
  for (const auto& [pid, names] : arena_names_by_pid(name_prefix.substr(1))) {
    const bool gone = pid > std::numeric_limits<pid_t>::max() ||
                      (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
    if (gone)
      removed += unlink_all(names);
  }
  return removed;
}

std::size_t shared_arena::remove_left_by(long pid) {
  if (pid <= 0)
    return 0;
  auto names = arena_names_by_pid(name_prefix.substr(1)); // "troupe-", as listed in /dev/shm
  auto it = names.find(pid);
  return it == names.end() ? 0 : unlink_all(it->second);
}

expected<std::unique_ptr<shared_arena>> shared_arena::create(std::string name, std::size_t bytes) {
  if (auto ok = check_name(name); !ok)
    return make_error(errc::invalid_argument, "{}", ok.error().message());
  auto capacity = round_up(bytes);
  if (capacity == 0 || capacity > max_bytes)
    return make_error(errc::invalid_argument, "arena '{}': size {} must be in [1, {}]", name,
                      bytes, max_bytes);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    // A stale arena from a run that crashed before unlinking: nobody can
    // still be handing out regions of it under our name.
    ::shm_unlink(name.c_str());
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  if (fd < 0)
    return make_error(errc::io_error, "arena '{}': shm_open: {}", name, std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
    auto err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return make_error(errc::io_error, "arena '{}': ftruncate to {} bytes: {}", name, capacity,
                      std::strerror(err));
  }
  void* base = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    auto err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return make_error(errc::io_error, "arena '{}': mmap of {} bytes: {}", name, capacity,
                      std::strerror(err));
  }
  auto s = std::make_shared<state>(std::move(name), fd, base, capacity);
  return std::unique_ptr<shared_arena>(new shared_arena(std::move(s)));
}

shared_arena::shared_arena(std::shared_ptr<state> s) : state_(std::move(s)) {}

shared_arena::~shared_arena() { ::shm_unlink(state_->name_.c_str()); }

expected<tensor> shared_arena::allocate(const dims& shape, dtype type) {
  std::uint64_t count = 1;
  for (auto d : shape) {
    if (d < 0)
      return make_error(errc::invalid_argument, "arena '{}': negative dimension in {}",
                        state_->name_, shape);
    count *= static_cast<std::uint64_t>(d);
  }
  auto bytes = count * size_of(type);
  if (bytes > state_->capacity_)
    return make_error(errc::size_limit_exceeded, "arena '{}': {} bytes exceed its {}",
                      state_->name_, bytes, state_->capacity_);
  auto offset = state_->allocate(bytes);
  if (!offset)
    return offset.error();
  auto memory = storage::wrap(state_->base_ + *offset, bytes, device::cpu(),
                              [s = state_, at = *offset](void*) { s->drop_local(at); });
  return tensor::from_storage(std::move(memory), shape, contiguous_strides(shape), 0, type);
}

expected<arena_handoff> shared_arena::share(const message_meta& meta, const tensor& value) {
  auto ref = state_->share(value);
  if (!ref)
    return ref.error();
  auto encoded = encode(meta, value);
  auto header = encoded.header_bytes();
  return arena_handoff{std::move(*ref), std::vector<std::byte>(header.begin(), header.end())};
}

expected<arena_ref> shared_arena::share_region(const tensor& value) { return state_->share(value); }

bool shared_arena::contains(const tensor& value) const noexcept {
  if (!value.defined() || value.where().kind != device_kind::cpu)
    return false;
  auto* data = static_cast<const std::byte*>(value.raw_data());
  return data >= state_->base_ && data < state_->base_ + state_->capacity_;
}

expected<void> shared_arena::release(const arena_ref& region) { return state_->release(region); }

const std::string& shared_arena::name() const noexcept { return state_->name_; }
std::size_t shared_arena::capacity() const noexcept { return state_->capacity_; }
std::size_t shared_arena::used_bytes() const { return state_->used(); }
std::size_t shared_arena::shared_regions() const { return state_->shared_regions(); }
const void* shared_arena::base() const noexcept { return state_->base_; }

// -- receiver ------------------------------------------------------------------

struct arena_mapper::mapping {
  std::byte* base = nullptr;
  std::size_t size = 0;
  ~mapping() {
    if (base)
      ::munmap(base, size);
  }
};

struct arena_mapper::state {
  release_function release;
  std::uint64_t max_arena_bytes;
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<mapping>> mapped;
};

arena_mapper::arena_mapper(release_function release, std::uint64_t max_arena_bytes)
    : state_(std::make_shared<state>()) {
  state_->release = std::move(release);
  state_->max_arena_bytes = max_arena_bytes;
}

arena_mapper::~arena_mapper() = default;

std::size_t arena_mapper::mapped_arenas() const {
  std::lock_guard guard(state_->mutex);
  return state_->mapped.size();
}

expected<tensor_message> arena_mapper::open(const arena_handoff& handoff) {
  const auto& ref = handoff.region;
  if (auto ok = check_name(ref.arena); !ok)
    return ok.error();
  std::shared_ptr<mapping> map;
  {
    std::lock_guard guard(state_->mutex);
    auto& slot = state_->mapped[ref.arena];
    if (!slot) {
      int fd = ::shm_open(ref.arena.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        state_->mapped.erase(ref.arena);
        return make_error(errc::io_error, "arena '{}': shm_open: {}", ref.arena,
                          std::strerror(errno));
      }
      struct stat info {};
      auto fstat_ok = ::fstat(fd, &info) == 0;
      auto size = fstat_ok ? static_cast<std::uint64_t>(info.st_size) : 0;
      if (!fstat_ok || size == 0 || size > state_->max_arena_bytes) {
        ::close(fd);
        state_->mapped.erase(ref.arena);
        return make_error(errc::size_limit_exceeded, "arena '{}' is {} bytes but must be in [1, {}]",
                          ref.arena, size, state_->max_arena_bytes);
      }
      void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd); // the mapping keeps the object alive
      if (base == MAP_FAILED) {
        state_->mapped.erase(ref.arena);
        return make_error(errc::io_error, "arena '{}': mmap: {}", ref.arena,
                          std::strerror(errno));
      }
      slot = std::make_shared<mapping>();
      slot->base = static_cast<std::byte*>(base);
      slot->size = size;
    }
    map = slot;
  }
  // Offset and length from the wire: inside the mapping, without overflow,
  // and aligned like every region the owner hands out.
  if (ref.offset % block != 0 || ref.length > map->size || ref.offset > map->size - ref.length)
    return make_error(errc::malformed_message,
                      "arena '{}': region (offset {}, {} bytes) must be 64-byte aligned and lie "
                      "in [0, {}]",
                      ref.arena, ref.offset, ref.length, map->size);
  auto parsed = decode_header(handoff.header);
  if (!parsed)
    return parsed.error();
  if (parsed->byte_count != ref.length)
    return make_error(errc::malformed_message,
                      "arena '{}': region is {} bytes but the header's byteCount is {}",
                      ref.arena, ref.length, parsed->byte_count);
  // From here on the region is accepted: when the last view of it goes,
  // the owner is told, whatever happens next.
  auto region = storage::wrap(map->base + ref.offset, ref.length, device::cpu(),
                              [s = state_, map, ref](void*) {
                                if (s->release)
                                  s->release(ref);
                              });
  auto decoded = decode(handoff.header, std::move(region));
  if (!decoded)
    return decoded.error();
  tensor_message out;
  out.meta = std::move(decoded->meta);
  out.flow_id = out.meta.flow_id;
  out.value = std::move(decoded->value);
  return out;
}

// -- loans -----------------------------------------------------------------------

void arena_loans::lend(const std::string& peer, const arena_ref& region) {
  std::lock_guard guard(mutex_);
  ++loans_[peer][key{region.arena, region.offset, region.length}];
}

expected<void> arena_loans::give_back(const std::string& peer, const arena_ref& region) {
  std::lock_guard guard(mutex_);
  auto by_peer = loans_.find(peer);
  if (by_peer != loans_.end()) {
    if (auto it = by_peer->second.find(key{region.arena, region.offset, region.length});
        it != by_peer->second.end()) {
      if (--it->second == 0)
        by_peer->second.erase(it);
      return {};
    }
  }
  return make_error(errc::invalid_argument,
                    "release from '{}' of region (arena '{}', offset {}, {} bytes) that was not lent to it",
                    peer, region.arena, region.offset, region.length);
}

std::vector<arena_ref> arena_loans::take_all(const std::string& peer) {
  std::vector<arena_ref> out;
  std::lock_guard guard(mutex_);
  auto by_peer = loans_.find(peer);
  if (by_peer == loans_.end())
    return out;
  for (auto& [k, count] : by_peer->second)
    for (std::uint32_t i = 0; i < count; ++i)
      out.push_back(arena_ref{k.arena, k.offset, k.length});
  loans_.erase(by_peer);
  return out;
}

std::size_t arena_loans::outstanding(const std::string& peer) const {
  std::lock_guard guard(mutex_);
  std::size_t n = 0;
  for (auto& [name, regions] : loans_)
    if (peer.empty() || name == peer)
      for (auto& [k, count] : regions)
        n += count;
  return n;
}

} // namespace troupe::actors
