#include "same_host_workspace.hpp"

#include "same_host_layout.hpp"

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <random>
#include <thread>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/actors/shared_arena.hpp"
#include "troupe/parallel/ring_allreduce.hpp"

namespace troupe::parallel {

namespace {

using clock = std::chrono::steady_clock;

using namespace same_host_layout;

constexpr std::string_view name_prefix = "/troupe-ws-";
constexpr std::string_view arena_prefix = "/troupe-"; // shared_arena::name_for
constexpr std::uint64_t max_arena_bytes = actors::shared_arena::max_bytes;

/// Wrap-safe "a is at or after b" for pass numbers.
bool at_or_after(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) >= 0; }

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Shared (not FUTEX_PRIVATE): the word lies in memory other processes map.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

/// Tells waiters on `c` that something it publishes changed.
void ring_doorbell(control& c) {
  c.doorbell.fetch_add(1);
  if (c.sleepers.load() > 0)
    futex(&c.doorbell, FUTEX_WAKE, INT_MAX, nullptr);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// A shared-memory name from another process: `prefix`, then at most 255
/// bytes in all of [A-Za-z0-9] and `punctuation` (`what` names it in errors).
expected<void> check_shm_name(const std::string& name, const char* what, std::string_view prefix,
                              std::string_view punctuation) {
  if (name.size() <= prefix.size() || name.size() > 255 || name.compare(0, prefix.size(), prefix) != 0)
    return make_error(errc::malformed_message, "{} name '{}' must start with '{}' and be at most 255 bytes", what, name,
                      prefix);
  for (std::size_t i = 1; i < name.size(); ++i) {
    auto c = static_cast<unsigned char>(name[i]);
    if (!(std::isalnum(c) || punctuation.find(static_cast<char>(c)) != std::string_view::npos))
      return make_error(errc::malformed_message, "{} name '{}' has character {:#x} at {}; allowed are [A-Za-z0-9{}]",
                        what, name, static_cast<unsigned>(c), i, punctuation);
  }
  return {};
}

/// `bytes` from `offset` lie inside `capacity` bytes (no overflow).
bool fits(std::uint64_t offset, std::uint64_t bytes, std::uint64_t capacity) {
  return offset <= capacity && bytes <= capacity - offset;
}

expected<void> check_name(const std::string& name) { return check_shm_name(name, "workspace", name_prefix, "-"); }

/// A node arena's name as shared_arena::name_for makes them.
expected<void> check_arena_name(const std::string& name) {
  return check_shm_name(name, "arena", arena_prefix, "_.-");
}

} // namespace

struct same_host_workspace::segment {
  std::string name;
  void* base = nullptr;
  std::size_t bytes = 0;
  bool linked = false; // this process created the name and has not unlinked it
  /// A peer's node arena, mapped read-write (nullptr: it announced none).
  std::byte* arena = nullptr;
  std::size_t arena_bytes = 0;

  control& head() const { return *static_cast<control*>(base); }
  std::byte* slot(std::uint32_t i, std::size_t pass_bytes) const {
    return static_cast<std::byte*>(base) + control_bytes + i * pass_bytes;
  }
  ~segment() {
    if (arena)
      ::munmap(arena, arena_bytes);
    if (base)
      ::munmap(base, bytes);
    if (linked)
      ::shm_unlink(name.c_str());
  }
};

same_host_workspace::same_host_workspace(same_host_workspace_options options) : options_(std::move(options)) {
  segments_.resize(options_.size);
  spin_ = options_.size <= std::max(1u, std::thread::hardware_concurrency());
}

same_host_workspace::~same_host_workspace() = default;

expected<std::unique_ptr<same_host_workspace>> same_host_workspace::create(same_host_workspace_options options) {
  if (options.size < 2 || options.rank >= options.size)
    return make_error(errc::invalid_argument, "same-host workspace: rank {} of {} (needs 2 or more ranks)",
                      options.rank, options.size);
  if (options.pass_bytes < 4096 || options.pass_bytes % 64 != 0 || options.pass_bytes > (std::size_t{1} << 30))
    return make_error(errc::invalid_argument,
                      "same-host workspace: pass_bytes {} must be a multiple of 64 in [4096, 2^30]",
                      options.pass_bytes);
  if (!options.arena_name.empty()) {
    if (auto ok = check_arena_name(options.arena_name); !ok)
      return make_error(errc::invalid_argument, "same-host workspace: {}", ok.error().message());
    if (options.arena_base == nullptr || options.arena_bytes == 0 || options.arena_bytes > max_arena_bytes)
      return make_error(errc::invalid_argument, "same-host workspace: arena {} of {} bytes at {}; need a mapping of "
                        "1 to 2^40 bytes", options.arena_name, options.arena_bytes, options.arena_base);
  }
  std::unique_ptr<same_host_workspace> ws(new same_host_workspace(std::move(options)));
  const auto& o = ws->options_;
  std::random_device entropy;
  const std::uint64_t nonce = (std::uint64_t{entropy()} << 32) | entropy();
  auto seg = std::make_unique<segment>();
  seg->name = fmt::format("{}{}-{}-{:016x}", name_prefix, ::getpid(), o.rank, nonce);
  seg->bytes = segment_bytes(o.pass_bytes);
  int fd = ::shm_open(seg->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return make_error(errc::io_error, "same-host workspace: shm_open({}): {}", seg->name, std::strerror(errno));
  seg->linked = true;
  if (::ftruncate(fd, static_cast<off_t>(seg->bytes)) != 0) {
    auto why = std::strerror(errno);
    ::close(fd);
    return make_error(errc::io_error, "same-host workspace: ftruncate({}, {}): {}", seg->name, seg->bytes, why);
  }
  void* base = ::mmap(nullptr, seg->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED)
    return make_error(errc::io_error, "same-host workspace: mmap({}): {}", seg->name, std::strerror(errno));
  seg->base = base;
  auto* c = new (base) control;
  c->nonce = nonce;
  c->pass_bytes = o.pass_bytes;
  c->slots = slot_count;
  c->rank = o.rank;
  c->pid = static_cast<std::uint64_t>(::getpid());
  c->base_address = reinterpret_cast<std::uintptr_t>(base);
  std::atomic_thread_fence(std::memory_order_release);
  c->magic = magic;
  ws->segments_[o.rank] = std::move(seg);
  return ws;
}

std::string same_host_workspace::who(std::uint32_t rank) const {
  return options_.describe ? options_.describe(rank) : fmt::format("rank {}", rank);
}

same_host_workspace::invitation same_host_workspace::own() const {
  const auto& seg = *segments_[options_.rank];
  return {seg.name, seg.head().nonce, options_.pass_bytes, options_.arena_name, options_.arena_bytes};
}

expected<void> same_host_workspace::map_peer(std::uint32_t rank, const invitation& peer) {
  if (rank >= options_.size || rank == options_.rank)
    return make_error(errc::invalid_argument, "same-host workspace: no peer rank {} in a group of {}", rank,
                      options_.size);
  const auto owner = who(rank);
  if (auto ok = check_name(peer.name); !ok)
    return make_error(errc::malformed_message, "same-host workspace of {}: {}", owner, ok.error().message());
  if (peer.pass_bytes != options_.pass_bytes)
    return make_error(errc::invalid_argument, "same-host workspace of {}: pass_bytes {} differs from this rank's {}",
                      owner, peer.pass_bytes, options_.pass_bytes);
  int fd = ::shm_open(peer.name.c_str(), O_RDWR, 0);
  if (fd < 0)
    return make_error(errc::io_error, "same-host workspace of {}: shm_open({}): {}", owner, peer.name,
                      std::strerror(errno));
  struct stat info {};
  const auto want = segment_bytes(options_.pass_bytes);
  if (::fstat(fd, &info) != 0 || static_cast<std::size_t>(info.st_size) != want) {
    ::close(fd);
    return make_error(errc::malformed_message, "same-host workspace of {}: {} has {} bytes, want {}", owner,
                      peer.name, static_cast<long long>(info.st_size), want);
  }
  void* base = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED)
    return make_error(errc::io_error, "same-host workspace of {}: mmap({}): {}", owner, peer.name, std::strerror(errno));
  auto seg = std::make_unique<segment>();
  seg->name = peer.name;
  seg->base = base;
  seg->bytes = want;
  if (!peer.arena.empty()) {
    if (auto ok = check_arena_name(peer.arena); !ok)
      return make_error(errc::malformed_message, "same-host workspace of {}: {}", owner, ok.error().message());
    int arena_fd = ::shm_open(peer.arena.c_str(), O_RDWR, 0);
    if (arena_fd < 0)
      return make_error(errc::io_error, "same-host workspace of {}: shm_open({}): {}", owner, peer.arena,
                        std::strerror(errno));
    struct stat arena_info {};
    if (::fstat(arena_fd, &arena_info) != 0 || peer.arena_bytes == 0 || peer.arena_bytes > max_arena_bytes ||
        static_cast<std::uint64_t>(arena_info.st_size) != peer.arena_bytes) {
      ::close(arena_fd);
      return make_error(errc::malformed_message, "same-host workspace of {}: arena {} has {} bytes, announced {}",
                        owner, peer.arena, static_cast<long long>(arena_info.st_size), peer.arena_bytes);
    }
    void* arena = ::mmap(nullptr, peer.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0);
    ::close(arena_fd);
    if (arena == MAP_FAILED)
      return make_error(errc::io_error, "same-host workspace of {}: mmap({}): {}", owner, peer.arena,
                        std::strerror(errno));
    seg->arena = static_cast<std::byte*>(arena);
    seg->arena_bytes = peer.arena_bytes;
  }
  const auto& c = seg->head();
  if (c.magic != magic || c.nonce != peer.nonce || c.pass_bytes != options_.pass_bytes || c.slots != slot_count ||
      c.rank != rank)
    return make_error(errc::malformed_message,
                      "same-host workspace of {}: {} does not hold what was announced (nonce {:#x} vs {:#x}, "
                      "rank {}, pass_bytes {})",
                      owner, peer.name, c.nonce, peer.nonce, c.rank, c.pass_bytes);
  segments_[rank] = std::move(seg);
  return {};
}

template <class Pred> expected<void> same_host_workspace::wait_for(std::uint32_t peer, const char* what, Pred ready) {
  if (ready())
    return {};
  auto& c = segments_[peer]->head();
  const auto start = clock::now();
  // Polls `ready`, pausing between polls, until `budget` has passed since
  // `start` (the clock is read every `every` polls).
  auto poll = [&](auto pause, std::uint32_t every, std::chrono::microseconds budget) {
    for (std::uint32_t i = 1;; ++i) {
      if (ready())
        return true;
      pause();
      if (i % every == 0 && clock::now() - start > budget)
        return false;
    }
  };
  // The peer is likely running on another core: it often answers within a
  // microsecond or two, far less than a futex sleep and wake-up. Kept
  // short: when the scheduler has put both on one core (a woken process
  // lands on its waker's core until the balancer moves it), every
  // microsecond spun is one the peer cannot run.
  if (spin_ && poll(cpu_relax, 32, std::chrono::microseconds(2)))
    return {};
  // Then give the core up: with more ranks than cores (or when the
  // scheduler put the peer on this core) the rank this one waits for may be
  // waiting for it, and yielding lets it run at once, without the futex's
  // sleep and wake-up on both sides.
  if (poll([] { sched_yield(); }, 8, std::chrono::microseconds(200)))
    return {};
  const auto deadline = start + options_.timeout;
  while (true) {
    c.sleepers.fetch_add(1);
    const auto bell = c.doorbell.load();
    if (ready()) {
      c.sleepers.fetch_sub(1);
      return {};
    }
    timespec slice{0, 2'000'000}; // 2 ms: how often the failure flag and the deadline are looked at
    futex(&c.doorbell, FUTEX_WAIT, bell, &slice);
    c.sleepers.fetch_sub(1);
    if (ready())
      return {};
    if (options_.failure)
      if (auto failed = options_.failure())
        return make_error(errc::io_error, "same-host collective: {}", *failed);
    if (clock::now() > deadline)
      return make_error(errc::io_error, "same-host collective: {} did not {} within {} ms",
                        who(peer), what,
                        options_.timeout.count());
  }
}

expected<void> same_host_workspace::finish_setup() {
  for (std::uint32_t k = 0; k < options_.size; ++k)
    if (!segments_[k])
      return make_error(errc::invalid_argument, "same-host workspace: rank {}'s segment is not mapped", k);
  auto& mine = *segments_[options_.rank];
  mine.head().reads_peers = options_.single_copy && probe_single_copy() ? 1 : 0;
  mine.head().ready.store(1);
  ring_doorbell(mine.head());
  read_by_peers_ = options_.single_copy;
  for (std::uint32_t k = 0; k < options_.size; ++k)
    if (k != options_.rank) {
      const auto& c = segments_[k]->head();
      if (auto ok = wait_for(k, "map every member's workspace", [&c] { return c.ready.load() != 0; }); !ok)
        return ok;
      read_by_peers_ = read_by_peers_ && c.reads_peers == 1;
    }
  // Every peer has mapped this segment: the name is no longer needed.
  ::shm_unlink(mine.name.c_str());
  mine.linked = false;
  return {};
}

bool same_host_workspace::probe_single_copy() const {
  for (std::uint32_t k = 0; k < options_.size; ++k) {
    if (k == options_.rank)
      continue;
    const auto& c = segments_[k]->head();
    if (c.pid == 0 || c.pid > static_cast<std::uint64_t>(INT_MAX))
      return false;
    std::uint64_t head[2] = {0, 0}; // magic, nonce: control's first fields
    iovec local{head, sizeof head};
    iovec remote{reinterpret_cast<void*>(c.base_address), sizeof head};
    if (::process_vm_readv(static_cast<pid_t>(c.pid), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof head) ||
        head[0] != magic || head[1] != c.nonce)
      return false;
  }
  return true;
}

std::uint64_t same_host_workspace::take_ticket() {
  std::lock_guard lock(order_mutex_);
  return next_ticket_++;
}

expected<void> same_host_workspace::turn(std::uint64_t ticket) {
  std::unique_lock lock(order_mutex_);
  const auto deadline = clock::now() + options_.timeout;
  while (!broken_ && serving_ != ticket)
    if (order_changed_.wait_until(lock, deadline) == std::cv_status::timeout && !broken_ && serving_ != ticket) {
      broken_ = error(errc::io_error, fmt::format("same-host collective: collective {} still waits for collective {} "
                                                  "of this rank after {} ms",
                                                  ticket, serving_, options_.timeout.count()));
      order_changed_.notify_all();
    }
  if (broken_)
    return make_error(broken_->code(), "{} (the same-host workspace stopped at an earlier failure)",
                      broken_->message());
  return {};
}

void same_host_workspace::done(std::uint64_t ticket, const expected<void>& result) {
  {
    std::lock_guard lock(order_mutex_);
    serving_ = ticket + 1;
    if (!result && !broken_)
      broken_ = result.error();
  }
  order_changed_.notify_all();
}

namespace {

/// Segment r of one pass: acc = ((s0 + s1) + s2) + ... in rank order, the
/// last sum averaged if asked and written to `out` as well. One loop per
/// case, the branches outside, so that GCC vectorises each.
template <class T>
void reduce_segment(const std::vector<const T*>& src, T* acc, T* out, std::int64_t len, bool average) {
  const auto n = src.size();
  const T divisor = static_cast<T>(n);
  for (std::size_t j = 1; j < n; ++j) {
    const T* left = j == 1 ? src[0] : acc;
    const T* right = src[j];
    if (j + 1 < n) {
      for (std::int64_t i = 0; i < len; ++i)
        acc[i] = left[i] + right[i];
    } else if (average) {
      for (std::int64_t i = 0; i < len; ++i) {
        T v = (left[i] + right[i]) / divisor;
        acc[i] = v;
        out[i] = v;
      }
    } else {
      for (std::int64_t i = 0; i < len; ++i) {
        T v = left[i] + right[i];
        acc[i] = v;
        out[i] = v;
      }
    }
  }
}

/// The passes of one collective, pipelined: pass i + 1's values go out
/// before pass i is consumed, so the peers find them ready and the copy
/// fills what would otherwise be a wait.
template <class Publish, class Consume>
expected<void> pipelined(std::int64_t passes, Publish&& publish, Consume&& consume) {
  if (passes > 0)
    if (auto ok = publish(std::int64_t{0}); !ok)
      return ok;
  for (std::int64_t index = 0; index < passes; ++index) {
    if (index + 1 < passes)
      if (auto ok = publish(index + 1); !ok)
        return ok;
    if (auto ok = consume(index); !ok)
      return ok;
  }
  return {};
}

} // namespace

template <class T> T* same_host_workspace::slot_of(std::uint32_t rank, std::uint32_t s) const {
  return reinterpret_cast<T*>(segments_[rank]->slot(s % slot_count, options_.pass_bytes));
}

std::uint64_t same_host_workspace::arena_offset(const void* data, std::uint64_t bytes) const {
  if (options_.arena_base == nullptr)
    return in_slot;
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const auto arena = reinterpret_cast<std::uintptr_t>(options_.arena_base);
  return begin >= arena && fits(begin - arena, bytes, options_.arena_bytes) ? begin - arena : in_slot;
}

expected<std::byte*> same_host_workspace::peer_region(std::uint32_t k, std::uint64_t source, std::uint64_t bytes,
                                                      std::size_t alignment, const char* what) const {
  const auto& peer = *segments_[k];
  if (peer.arena == nullptr || source % alignment != 0 || !fits(source, bytes, peer.arena_bytes))
    return make_error(errc::malformed_message,
                      "same-host {}: {} published {} bytes at offset {} of its arena, which has {} bytes", what,
                      who(k), bytes, source, peer.arena_bytes);
  return peer.arena + source;
}

const char* same_host_workspace::name_of(collective kind) {
  switch (kind) {
  case collective::allreduce:
    return "allreduce";
  case collective::reduce_scatter:
    return "reduce-scatter";
  case collective::all_gather:
    return "all-gather";
  case collective::broadcast:
    return "broadcast";
  }
  return "collective";
}

expected<void> same_host_workspace::wait_slot_free(std::uint32_t s) {
  return wait_all_released(s - slot_count, "finish an earlier pass");
}

expected<void> same_host_workspace::wait_all_released(std::uint32_t s, const char* what) {
  for (std::uint32_t k = 0; k < options_.size; ++k)
    if (k != options_.rank) {
      const auto& c = segments_[k]->head();
      auto done_reading = [&c, s] { return at_or_after(c.released.load(std::memory_order_acquire), s); };
      if (auto ok = wait_for(k, what, done_reading); !ok)
        return ok;
    }
  return {};
}

void same_host_workspace::announce(std::uint32_t s, const pass_label& label, std::uint64_t source,
                                   const void* address) {
  auto& head = segments_[options_.rank]->head();
  auto& own_slot = head.slot[s % slot_count];
  own_slot.element_bytes = label.element_bytes;
  own_slot.kind = static_cast<std::uint32_t>(label.kind);
  own_slot.id = label.id;
  own_slot.count = label.count;
  own_slot.pass_index = label.index;
  own_slot.source = source;
  own_slot.address = reinterpret_cast<std::uintptr_t>(address);
  own_slot.published.store(s, std::memory_order_release);
  ring_doorbell(head);
}

expected<std::uint64_t> same_host_workspace::wait_published(std::uint32_t k, std::uint32_t s,
                                                            const pass_label& label) {
  const auto& theirs = segments_[k]->head().slot[s % slot_count];
  if (auto ok = wait_for(k, "publish its values",
                         [&theirs, s] { return theirs.published.load(std::memory_order_acquire) == s; });
      !ok)
    return ok.error();
  if (theirs.kind != static_cast<std::uint32_t>(label.kind) || theirs.id != label.id || theirs.count != label.count ||
      theirs.element_bytes != label.element_bytes || theirs.pass_index != label.index) {
    const bool known = theirs.kind >= static_cast<std::uint32_t>(collective::allreduce) &&
                       theirs.kind <= static_cast<std::uint32_t>(collective::broadcast);
    return make_error(errc::invalid_argument,
                      "same-host {}: {} is at collective {:#x} ({} of {} elements of {} bytes, pass {}) where this "
                      "rank is at collective {:#x} ({} of {} elements of {} bytes, pass {}): replicas must issue "
                      "their collectives in the same order and with the same sizes",
                      name_of(label.kind), who(k), theirs.id,
                      known ? name_of(static_cast<collective>(theirs.kind)) : "an unknown collective", theirs.count,
                      theirs.element_bytes, theirs.pass_index, label.id, name_of(label.kind), label.count,
                      label.element_bytes, label.index);
  }
  return theirs.source;
}

void same_host_workspace::release(std::uint32_t s) {
  auto& head = segments_[options_.rank]->head();
  head.released.store(s, std::memory_order_release);
  ring_doorbell(head);
}

std::uint64_t same_host_workspace::announced_address(std::uint32_t k, std::uint32_t s) const {
  return segments_[k]->head().slot[s % slot_count].address;
}

expected<void> same_host_workspace::read_from_peer(std::uint32_t k, std::uint64_t address, void* to,
                                                   std::size_t bytes, const char* what) {
  const auto pid = static_cast<pid_t>(segments_[k]->head().pid);
  auto* into = static_cast<std::byte*>(to);
  for (std::size_t done = 0; done < bytes;) {
    // A read stops short at a page the peer does not map; the rest is
    // asked for again, so that such a page is the error reported.
    iovec local{into + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    const auto got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0)
      return make_error(errc::malformed_message,
                        "same-host {}: reading {} bytes at {:#x} of {}'s process (pid {}) failed at byte {}: {}", what,
                        bytes, address, who(k), pid, done, got < 0 ? std::strerror(errno) : "nothing read");
    done += static_cast<std::size_t>(got);
  }
  read_across_processes_.fetch_add(1);
  return {};
}

template <class T>
expected<void> same_host_workspace::wait_all_published(std::uint32_t s, const pass_label& label, std::uint64_t bytes,
                                                       std::vector<T*>& regions) {
  for (std::uint32_t k = 0; k < options_.size; ++k) {
    regions[k] = nullptr;
    if (k == options_.rank)
      continue;
    auto source = wait_published(k, s, label);
    if (!source)
      return source.error();
    if (*source == in_slot)
      continue;
    auto region = peer_region(k, *source, bytes, alignof(T), name_of(label.kind));
    if (!region)
      return region.error();
    regions[k] = reinterpret_cast<T*>(*region);
  }
  return {};
}

void same_host_workspace::publish_reduced(std::uint32_t s) {
  auto& head = segments_[options_.rank]->head();
  head.slot[s % slot_count].reduced.store(s, std::memory_order_release);
  ring_doorbell(head);
}

expected<void> same_host_workspace::wait_reduced(std::uint32_t k, std::uint32_t s, const char* what) {
  const auto& theirs = segments_[k]->head().slot[s % slot_count];
  return wait_for(k, what, [&theirs, s] { return theirs.reduced.load(std::memory_order_acquire) == s; });
}

same_host_workspace::pass_plan same_host_workspace::plan_passes(collective kind, std::uint32_t element_bytes,
                                                               std::uint64_t id, std::int64_t count) {
  return plan_passes(kind, element_bytes, id, count, static_cast<std::int64_t>(options_.pass_bytes / element_bytes));
}

same_host_workspace::pass_plan same_host_workspace::plan_passes(collective kind, std::uint32_t element_bytes,
                                                               std::uint64_t id, std::int64_t count,
                                                               std::int64_t per_pass, std::int64_t passes) {
  if (passes < 0)
    passes = (count + per_pass - 1) / per_pass;
  pass_plan plan{kind, element_bytes, id, count, per_pass, passes, pass_ + 1};
  pass_ += static_cast<std::uint32_t>(passes);
  return plan;
}

template <class T>
expected<void> same_host_workspace::allreduce(T* data, std::int64_t count, bool average, std::uint64_t id,
                                              std::uint64_t ticket) {
  if (auto ok = turn(ticket); !ok)
    return ok;
  const std::uint32_t n = options_.size;
  const std::uint32_t r = options_.rank;
  std::vector<const T*> sources(n); // each rank's values of this rank's segment, one pass at a time
  std::vector<T*> in_place(n); // a peer's whole tensor in its arena, or nullptr

  const auto plan = plan_passes(collective::allreduce, sizeof(T), id, count);
  // This rank's tensor in its node's arena: the peers read it in place.
  const auto total_bytes = static_cast<std::uint64_t>(count) * sizeof(T);
  const std::uint64_t source = arena_offset(data, total_bytes);

  // Steps 1 and 2 for one pass.
  auto publish = [&](std::int64_t index) -> expected<void> {
    const auto s = plan.pass(index);
    const auto len = plan.length(index);
    const T* here = data + plan.offset(index);
    // 1. The slot is free once every peer has finished pass s - slots.
    if (auto ok = wait_slot_free(s); !ok)
      return ok;
    // 2. This rank's values of the other segments go into its slot (unless
    // the peers read them where they lie).
    for (std::uint32_t k = 0; k < n && source == in_slot; ++k)
      if (k != r) {
        auto seg = ring_segment(len, n, k);
        std::memcpy(slot_of<T>(r, s) + seg.begin, here + seg.begin,
                    static_cast<std::size_t>(seg.end - seg.begin) * sizeof(T));
      }
    announce(s, plan.label(index), source);
    return {};
  };

  auto consume = [&](std::int64_t index) -> expected<void> {
    const auto s = plan.pass(index);
    const auto len = plan.length(index);
    T* here = data + plan.offset(index);

    // 3. Every peer's values of this pass, for the same collective.
    if (auto ok = wait_all_published(s, plan.label(index), total_bytes, in_place); !ok)
      return ok;

    // 4. Reduce segment r, in rank order.
    auto own = ring_segment(len, n, r);
    for (std::uint32_t k = 0; k < n; ++k)
      sources[k] = (k == r                 ? here
                    : in_place[k] != nullptr ? in_place[k] + plan.offset(index)
                                             : slot_of<T>(k, s)) +
                   own.begin;
    reduce_segment(sources, slot_of<T>(r, s) + own.begin, here + own.begin, own.end - own.begin, average);
    // Peers whose tensors lie in their arenas get the result written
    // straight into them (from the slot, still in cache): they skip step
    // 5's copy for this segment.
    for (std::uint32_t k = 0; k < n; ++k)
      if (k != r && in_place[k] != nullptr)
        std::memcpy(in_place[k] + plan.offset(index) + own.begin, slot_of<T>(r, s) + own.begin,
                    static_cast<std::size_t>(own.end - own.begin) * sizeof(T));
    publish_reduced(s);

    // 5. The other segments, final, from their owners (next rank first,
    // so that the ranks do not all read one slot at once).
    for (std::uint32_t step = 1; step < n; ++step) {
      const auto k = (r + step) % n;
      if (auto ok = wait_reduced(k, s, "reduce its segment"); !ok)
        return ok;
      if (source != in_slot)
        continue; // rank k wrote segment k into this rank's tensor itself
      auto seg = ring_segment(len, n, k);
      std::memcpy(here + seg.begin, slot_of<T>(k, s) + seg.begin,
                  static_cast<std::size_t>(seg.end - seg.begin) * sizeof(T));
    }

    // 6. Done reading the peers' slots of pass s.
    release(s);
    return {};
  };
  auto result = pipelined(plan.passes, publish, consume);
  if (result) {
    if (source != in_slot)
      published_in_place_.fetch_add(1);
    for (std::uint32_t k = 0; k < n; ++k)
      if (in_place[k] != nullptr)
        read_in_place_.fetch_add(1);
  }
  done(ticket, result);
  return result;
}


template <class T>
expected<void> same_host_workspace::reduce_scatter(const T* data, std::int64_t count, T* out, bool average,
                                                   std::uint64_t id, std::uint64_t ticket) {
  if (auto ok = turn(ticket); !ok)
    return ok;
  const std::uint32_t n = options_.size;
  const std::uint32_t r = options_.rank;
  // A pass carries `width` elements of each rank's segment: this rank's
  // values of segment k go to part k of its slot (part r stays free and
  // holds the partial sums).
  const auto width = static_cast<std::int64_t>(options_.pass_bytes / sizeof(T)) / n;
  if (width == 0) {
    auto refused = make_error(errc::invalid_argument, "same-host reduce-scatter: {} ranks do not fit a pass of {} bytes",
                              n, options_.pass_bytes);
    done(ticket, refused);
    return refused;
  }
  std::vector<ring_range> segs(n);
  std::int64_t longest = 0;
  for (std::uint32_t k = 0; k < n; ++k) {
    segs[k] = ring_segment(count, n, k);
    longest = std::max(longest, segs[k].end - segs[k].begin);
  }
  const auto plan =
    plan_passes(collective::reduce_scatter, sizeof(T), id, count, width, (longest + width - 1) / width);
  // Elements of segment k in pass `index` (none once it has run out).
  auto extent = [&](std::uint32_t k, std::int64_t index) {
    return std::clamp<std::int64_t>(segs[k].end - segs[k].begin - index * width, 0, width);
  };
  auto publish = [&](std::int64_t index) -> expected<void> {
    const auto s = plan.pass(index);
    if (auto ok = wait_slot_free(s); !ok)
      return ok;
    for (std::uint32_t k = 0; k < n; ++k)
      if (k != r)
        std::memcpy(slot_of<T>(r, s) + k * width, data + segs[k].begin + index * width,
                    static_cast<std::size_t>(extent(k, index)) * sizeof(T));
    announce(s, plan.label(index), in_slot);
    return {};
  };
  std::vector<const T*> sources(n);
  auto consume = [&](std::int64_t index) -> expected<void> {
    const auto s = plan.pass(index);
    for (std::uint32_t k = 0; k < n; ++k)
      if (k != r)
        if (auto ok = wait_published(k, s, plan.label(index)); !ok)
          return ok.error();
    // The same additions in the same (rank) order as the allreduce's.
    for (std::uint32_t k = 0; k < n; ++k)
      sources[k] = k == r ? data + segs[r].begin + index * width : slot_of<T>(k, s) + r * width;
    reduce_segment(sources, slot_of<T>(r, s) + r * width, out + index * width, extent(r, index), average);
    release(s);
    return {};
  };
  auto result = pipelined(plan.passes, publish, consume);
  done(ticket, result);
  return result;
}

template <class T>
expected<void> same_host_workspace::all_gather(const T* mine, std::int64_t count, T* out, std::uint64_t id,
                                               std::uint64_t ticket) {
  if (auto ok = turn(ticket); !ok)
    return ok;
  const std::uint32_t n = options_.size;
  const std::uint32_t r = options_.rank;
  const auto plan = plan_passes(collective::all_gather, sizeof(T), id, count);
  // An output in this node's arena: the peers write their pieces into it.
  const auto out_bytes = static_cast<std::uint64_t>(count) * n * sizeof(T);
  const std::uint64_t source = arena_offset(out, out_bytes);
  std::vector<T*> theirs(n); // a peer's output in its arena, or nullptr
  // Every peer can read this rank's piece where it lies (single copy).
  const bool single_copy = read_by_peers_ && static_cast<std::uint64_t>(count) * sizeof(T) >= single_copy_min_bytes;
  const T* announced = single_copy ? mine : nullptr;
  bool read_from_here = false; // a peer read this rank's piece from its memory
  auto publish = [&](std::int64_t index) -> expected<void> {
    if (auto ok = wait_slot_free(plan.pass(index)); !ok)
      return ok;
    announce(plan.pass(index), plan.label(index), source, announced);
    return {};
  };
  auto consume = [&](std::int64_t index) -> expected<void> {
    const auto s = plan.pass(index);
    const T* piece = mine + plan.offset(index);
    // Hand this pass of the piece over: into the outputs of the peers whose
    // outputs lie in their arenas; the others read it from this process, or
    // from the slot.
    if (auto ok = wait_all_published(s, plan.label(index), out_bytes, theirs); !ok)
      return ok;
    bool through_slot = false;
    for (std::uint32_t k = 0; k < n; ++k)
      if (k != r && theirs[k] == nullptr) {
        through_slot = through_slot || announced == nullptr;
        read_from_here = read_from_here || announced != nullptr;
      }
    if (through_slot)
      std::memcpy(slot_of<T>(r, s), piece, plan.bytes(index));
    for (std::uint32_t step = 1; step < n; ++step) // next rank first: not all on one peer at once
      if (auto k = (r + step) % n; theirs[k] != nullptr)
        std::memcpy(theirs[k] + r * count + plan.offset(index), piece, plan.bytes(index));
    // This rank's own output last, while the pass is still in cache.
    std::memcpy(out + r * count + plan.offset(index), piece, plan.bytes(index));
    publish_reduced(s);
    // The others' pieces: already written here, read from their
    // processes, or copied from their slots.
    for (std::uint32_t step = 1; step < n; ++step) {
      const auto k = (r + step) % n;
      T* to = out + k * count + plan.offset(index);
      if (const auto address = announced_address(k, s); source == in_slot && address != 0) {
        const auto from = address + static_cast<std::uint64_t>(plan.offset(index)) * sizeof(T);
        if (auto ok = read_from_peer(k, from, to, plan.bytes(index), "all-gather"); !ok)
          return ok;
        continue;
      }
      if (auto ok = wait_reduced(k, s, "hand over its piece"); !ok)
        return ok;
      if (source == in_slot)
        std::memcpy(to, slot_of<T>(k, s), plan.bytes(index));
    }
    release(s);
    return {};
  };
  auto result = pipelined(plan.passes, publish, consume);
  // A piece read from this process stays as it is until every peer is done.
  if (result && read_from_here)
    result = wait_all_released(plan.pass(plan.passes - 1), "finish reading the all-gather's pieces");
  if (result && source != in_slot)
    published_in_place_.fetch_add(1);
  done(ticket, result);
  return result;
}

template <class T>
expected<void> same_host_workspace::broadcast(T* data, std::int64_t count, std::uint32_t root, std::uint64_t id,
                                              std::uint64_t ticket) {
  if (auto ok = turn(ticket); !ok)
    return ok;
  const std::uint32_t n = options_.size;
  const std::uint32_t r = options_.rank;
  const auto plan = plan_passes(collective::broadcast, sizeof(T), id, count);
  // A root tensor in the node's arena is read where it lies.
  const auto total_bytes = static_cast<std::uint64_t>(count) * sizeof(T);
  const std::uint64_t source = r == root ? arena_offset(data, total_bytes) : no_values;
  auto publish = [&](std::int64_t index) -> expected<void> {
    const auto s = plan.pass(index);
    if (auto ok = wait_slot_free(s); !ok)
      return ok;
    if (source == in_slot)
      std::memcpy(slot_of<T>(r, s), data + plan.offset(index), plan.bytes(index));
    announce(s, plan.label(index), source);
    return {};
  };
  const T* in_place = nullptr; // the root's tensor in its arena
  auto consume = [&](std::int64_t index) -> expected<void> {
    const auto s = plan.pass(index);
    // Every peer's header, so that all of them agree on the collective and
    // on its root: the root's holds values, nobody else's does.
    for (std::uint32_t k = 0; k < n; ++k) {
      if (k == r)
        continue;
      auto theirs = wait_published(k, s, plan.label(index));
      if (!theirs)
        return theirs.error();
      if ((k == root) == (*theirs == no_values))
        return make_error(errc::invalid_argument,
                          "same-host broadcast {:#x}: this rank takes the root to be {}, but {} {}: replicas "
                          "must name the same root",
                          id, who(root), who(k), k == root ? "sends no values" : "sends values as a root");
      if (k == root && *theirs != in_slot) {
        auto region = peer_region(k, *theirs, total_bytes, alignof(T), "broadcast");
        if (!region)
          return region.error();
        in_place = reinterpret_cast<const T*>(*region);
      }
    }
    if (r != root)
      std::memcpy(data + plan.offset(index),
                  in_place != nullptr ? in_place + plan.offset(index) : slot_of<T>(root, s), plan.bytes(index));
    release(s);
    return {};
  };
  auto result = pipelined(plan.passes, publish, consume);
  // A root read in place returns once every peer is done reading: its
  // caller may change the tensor next.
  if (result && source != in_slot && source != no_values && plan.passes > 0) {
    result = wait_all_released(plan.pass(plan.passes - 1), "finish reading the broadcast's values");
    if (result)
      published_in_place_.fetch_add(1);
  }
  done(ticket, result);
  return result;
}

template expected<void> same_host_workspace::allreduce<float>(float*, std::int64_t, bool, std::uint64_t, std::uint64_t);
template expected<void> same_host_workspace::allreduce<double>(double*, std::int64_t, bool, std::uint64_t,
                                                               std::uint64_t);
template expected<void> same_host_workspace::reduce_scatter<float>(const float*, std::int64_t, float*, bool,
                                                                   std::uint64_t, std::uint64_t);
template expected<void> same_host_workspace::reduce_scatter<double>(const double*, std::int64_t, double*, bool,
                                                                    std::uint64_t, std::uint64_t);
template expected<void> same_host_workspace::all_gather<float>(const float*, std::int64_t, float*, std::uint64_t,
                                                               std::uint64_t);
template expected<void> same_host_workspace::all_gather<double>(const double*, std::int64_t, double*, std::uint64_t,
                                                                std::uint64_t);
template expected<void> same_host_workspace::broadcast<float>(float*, std::int64_t, std::uint32_t, std::uint64_t,
                                                              std::uint64_t);
template expected<void> same_host_workspace::broadcast<double>(double*, std::int64_t, std::uint32_t, std::uint64_t,
                                                               std::uint64_t);

} // namespace troupe::parallel

namespace troupe::parallel {

namespace {
constexpr std::string_view offer_magic = "troupe-same-host 3";
constexpr std::size_t max_offer_bytes = 1024;
} // namespace

std::vector<std::byte> encode_offer(const same_host_offer& offer) {
  auto text = fmt::format("{}\n{}\n{}\n{}\n{:x}\n{}\n{}\n{}\n{}\n", offer_magic, offer.wants ? 1 : 0,
                          offer.host_key, offer.segment.name, offer.segment.nonce, offer.segment.pass_bytes,
                          offer.segment.arena, offer.segment.arena_bytes,
                          name_of(offer.messages));
  auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  return {bytes.begin(), bytes.end()};
}

expected<same_host_offer> decode_offer(std::span<const std::byte> bytes) {
  if (bytes.size() > max_offer_bytes)
    return make_error(errc::malformed_message, "same-host offer: {} bytes, at most {} allowed", bytes.size(),
                      max_offer_bytes);
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    auto end = text.find('\n');
    if (end == std::string_view::npos)
      return make_error(errc::malformed_message, "same-host offer: line {} does not end in a newline",
                        lines.size() + 1);
    lines.push_back(text.substr(0, end));
    text.remove_prefix(end + 1);
  }
  if (lines.size() != 9)
    return make_error(errc::malformed_message, "same-host offer: {} lines, want 9", lines.size());
  if (lines[0] != offer_magic)
    return make_error(errc::malformed_message, "same-host offer: first line '{}' is not '{}'", lines[0], offer_magic);
  same_host_offer out;
  if (lines[1] != "0" && lines[1] != "1")
    return make_error(errc::malformed_message, "same-host offer: 'wants' is '{}' but must be 0 or 1", lines[1]);
  out.wants = lines[1] == "1";
  for (char c : lines[2])
    if (!std::isprint(static_cast<unsigned char>(c)))
      return make_error(errc::malformed_message, "same-host offer: the host key has the unprintable byte {:#x}",
                        static_cast<unsigned>(static_cast<unsigned char>(c)));
  out.host_key = std::string(lines[2]);
  out.segment.name = std::string(lines[3]);
  if (out.wants)
    if (auto ok = check_name(out.segment.name); !ok)
      return make_error(errc::malformed_message, "same-host offer: {}", ok.error().message());
  auto number = [](std::string_view field, int base, std::uint64_t max, const char* what) -> expected<std::uint64_t> {
    if (field.empty() || field.size() > 20)
      return make_error(errc::malformed_message, "same-host offer: {} '{}' is not a number", what, field);
    std::uint64_t value = 0;
    for (char c : field) {
      int digit = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : base == 16 && c >= 'a' && c <= 'f'        ? c - 'a' + 10
                                                              : -1;
      if (digit < 0 || digit >= base)
        return make_error(errc::malformed_message, "same-host offer: {} '{}' is not a base-{} number", what, field,
                          base);
      if (value > (max - static_cast<std::uint64_t>(digit)) / static_cast<std::uint64_t>(base))
        return make_error(errc::malformed_message, "same-host offer: {} '{}' is above {}", what, field, max);
      value = value * static_cast<std::uint64_t>(base) + static_cast<std::uint64_t>(digit);
    }
    return value;
  };
  auto nonce = number(lines[4], 16, ~std::uint64_t{0}, "nonce");
  if (!nonce)
    return nonce.error();
  auto pass = number(lines[5], 10, std::uint64_t{1} << 30, "pass_bytes");
  if (!pass)
    return pass.error();
  out.segment.nonce = *nonce;
  out.segment.pass_bytes = *pass;
  // The node's arena: none ("" and 0), or a name and a size.
  auto arena_bytes = number(lines[7], 10, max_arena_bytes, "arena_bytes");
  if (!arena_bytes)
    return arena_bytes.error();
  out.segment.arena = std::string(lines[6]);
  out.segment.arena_bytes = *arena_bytes;
  if (out.segment.arena.empty() != (out.segment.arena_bytes == 0))
    return make_error(errc::malformed_message, "same-host offer: arena '{}' with {} bytes (need both or neither)",
                      out.segment.arena, out.segment.arena_bytes);
  if (!out.segment.arena.empty())
    if (auto ok = check_arena_name(out.segment.arena); !ok)
      return make_error(errc::malformed_message, "same-host offer: {}", ok.error().message());
  auto named = message_algorithm_named(lines[8]);
  if (!named)
    return make_error(errc::malformed_message, "same-host offer: {}", named.error().message());
  out.messages = *named;
  return out;
}

} // namespace troupe::parallel
