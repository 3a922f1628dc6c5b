// The recorder: per-thread single-producer rings drained by one flush thread.
//
// Thread model. Each recording thread owns one ring (attached on its first
// record of a session) and is its only producer; the flush thread is the only
// consumer of all rings. The producer publishes a record with a release store
// of `tail`; the consumer publishes the space it freed with a release store of
// `head`. start/stop/attach serialise on `control_mutex`; the hot path never
// takes it.
#include "troupe/actors/trace.hpp"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace troupe::trace {

namespace {

// ---- interned strings (process lifetime) ---------------------------------

struct string_table {
  std::mutex mutex;
  std::unordered_map<std::string, std::uint32_t> ids;
  std::deque<std::string> texts; // texts[i] has id i + 1; a deque keeps references stable
};

string_table& strings() {
  static auto* table = new string_table; // never destroyed: ids outlive every session
  return *table;
}

// ---- per-thread rings -----------------------------------------------------

struct thread_ring {
  thread_ring(std::size_t capacity, std::uint16_t index)
      : slots(new record[capacity]), mask(capacity - 1), thread_index(index),
        os_tid(static_cast<std::uint32_t>(::syscall(SYS_gettid))) {}

  std::unique_ptr<record[]> slots;
  std::uint64_t mask;
  std::uint16_t thread_index;
  std::uint32_t os_tid;
  std::uint64_t cached_head = 0; // producer's last view of head
  alignas(64) std::atomic<std::uint64_t> tail{0};
  alignas(64) std::atomic<std::uint64_t> head{0};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<bool> orphaned{false}; // its thread exited

  std::size_t bytes() const { return (mask + 1) * sizeof(record); }

  void push(const record& r) noexcept {
    auto t = tail.load(std::memory_order_relaxed);
    if (t - cached_head > mask) {
      cached_head = head.load(std::memory_order_acquire);
      if (t - cached_head > mask) {
        dropped.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    slots[t & mask] = r;
    tail.store(t + 1, std::memory_order_release);
  }
};

// ---- the session ----------------------------------------------------------

struct session {
  options opts;
  std::string path;
  file_writer writer;
  std::size_t ring_capacity = 0; // records

  // Rings, guarded by control_mutex for membership; contents lock-free.
  std::vector<std::shared_ptr<thread_ring>> rings;
  std::size_t ring_bytes = 0;
  std::uint16_t next_thread_index = 0;

  // Flush thread state, guarded by flush_mutex.
  std::mutex flush_mutex;
  std::condition_variable wake;
  std::condition_variable flushed;
  std::uint64_t flush_requested = 0;
  std::uint64_t flush_done = 0;
  bool stopping = false;
  std::thread flusher;

  // Owned by the flush thread.
  std::uint32_t strings_written = 0;
  std::vector<record> batch;
  std::vector<record> pending; // records of a chunk not yet written

  // Published statistics.
  std::mutex stats_mutex;
  recorder_stats stats;
};

std::mutex control_mutex;
std::unique_ptr<session> current;           // guarded by control_mutex
std::atomic<std::uint64_t> generation{1};   // bumped by start and stop
std::mutex lifetime_mutex;                  // held by start, stop and flush throughout
// Process-wide rather than per session, so that the lock-free readers never
// touch a session that stop() may be deleting.
std::atomic<std::uint64_t> flow_prefix{0};
std::atomic<std::uint64_t> flow_counter{0};
std::atomic<std::uint64_t> unbuffered_dropped{0}; // records of threads beyond the cap
recorder_stats last_stats;                  // guarded by control_mutex

// The calling thread's ring for the session of `tl_generation`. Two trivial
// thread_locals for the hot path; the holder (with a destructor) is touched
// only when attaching, and marks the ring orphaned when the thread exits.
thread_local thread_ring* tl_ring = nullptr;
thread_local std::uint64_t tl_generation = 0;

struct ring_holder {
  std::shared_ptr<thread_ring> ring;
  ~ring_holder() {
    if (ring)
      ring->orphaned.store(true, std::memory_order_release);
  }
};
thread_local ring_holder tl_holder;

thread_ring* attach_thread() noexcept {
  std::lock_guard lock(control_mutex);
  if (tl_holder.ring)
    tl_holder.ring->orphaned.store(true, std::memory_order_release);
  tl_holder.ring.reset();
  tl_ring = nullptr;
  tl_generation = generation.load(std::memory_order_acquire);
  session* s = current.get();
  if (!s)
    return nullptr;
  auto bytes = s->ring_capacity * sizeof(record);
  if (s->ring_bytes + bytes > s->opts.max_bytes || s->next_thread_index == 0xffff)
    return nullptr; // over the cap: this thread records nothing, counted as dropped
  try {
    auto ring = std::make_shared<thread_ring>(s->ring_capacity, s->next_thread_index++);
    s->rings.push_back(ring);
    s->ring_bytes += bytes;
    tl_holder.ring = ring;
    tl_ring = ring.get();
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  return tl_ring;
}

// ---- flushing -------------------------------------------------------------

constexpr std::size_t max_chunk_records = 8192;

void write_pending(session& s) {
  // New strings go in the same chunk as the records: a record's strings were
  // interned before it was pushed, so before this snapshot of the table.
  std::vector<string_entry> new_strings;
  std::uint32_t count;
  auto& table = strings();
  {
    std::lock_guard lock(table.mutex);
    count = static_cast<std::uint32_t>(table.texts.size());
    for (auto id = s.strings_written; id < count; ++id)
      new_strings.push_back({id + 1, table.texts[id]}); // deque: stable references
  }
  std::span<const record> all(s.pending);
  bool first = true;
  while (first || !all.empty()) {
    auto n = std::min(all.size(), max_chunk_records);
    std::span<const string_entry> strs = first ? std::span<const string_entry>(new_strings)
                                               : std::span<const string_entry>();
    if (strs.empty() && n == 0)
      break;
    auto ok = s.writer.write_chunk(strs, all.first(n));
    if (!ok) {
      // The disk refused: nothing better to do off the hot path than count.
      std::lock_guard lock(s.stats_mutex);
      s.stats.dropped += all.size();
      break;
    }
    std::lock_guard lock(s.stats_mutex);
    s.stats.records += n;
    s.stats.chunks += 1;
    s.stats.file_bytes = s.writer.bytes_written();
    all = all.subspan(n);
    first = false;
  }
  s.strings_written = count;
  s.pending.clear();
}

// Drains every ring into `pending`, writes it, and forgets rings whose thread
// has exited.
void drain_all(session& s) {
  std::vector<std::shared_ptr<thread_ring>> rings;
  {
    std::lock_guard lock(control_mutex);
    rings = s.rings;
  }
  std::uint64_t dropped_now = 0;
  for (auto& ring : rings) {
    bool was_orphaned = ring->orphaned.load(std::memory_order_acquire);
    auto h = ring->head.load(std::memory_order_relaxed);
    auto t = ring->tail.load(std::memory_order_acquire);
    // At most two contiguous runs (the ring wraps once).
    if (auto n = t - h; n > 0) {
      auto first = h & ring->mask;
      auto run = std::min<std::uint64_t>(n, ring->mask + 1 - first);
      s.pending.insert(s.pending.end(), ring->slots.get() + first, ring->slots.get() + first + run);
      s.pending.insert(s.pending.end(), ring->slots.get(), ring->slots.get() + (n - run));
    }
    ring->head.store(t, std::memory_order_release);
    if (auto d = ring->dropped.exchange(0, std::memory_order_relaxed)) {
      record r;
      r.type = event_type::dropped;
      r.time_ns = now_ns();
      r.value = d;
      r.thread = ring->thread_index;
      r.os_tid = ring->os_tid;
      s.pending.push_back(r);
      dropped_now += d;
    }
    if (was_orphaned) {
      std::lock_guard lock(control_mutex);
      std::erase(s.rings, ring);
      s.ring_bytes -= ring->bytes();
    }
  }
  if (auto d = unbuffered_dropped.exchange(0, std::memory_order_relaxed)) {
    record r;
    r.type = event_type::dropped;
    r.time_ns = now_ns();
    r.value = d;
    r.thread = 0xffff;
    s.pending.push_back(r);
    dropped_now += d;
  }
  {
    std::lock_guard lock(s.stats_mutex);
    s.stats.dropped += dropped_now;
  }
  write_pending(s);
}

void flush_loop(session* s) {
  std::unique_lock lock(s->flush_mutex);
  for (;;) {
    s->wake.wait_for(lock, s->opts.flush_interval,
                     [&] { return s->stopping || s->flush_requested > s->flush_done; });
    bool stopping = s->stopping;
    auto request = s->flush_requested;
    lock.unlock();
    drain_all(*s);
    lock.lock();
    s->flush_done = request;
    s->flushed.notify_all();
    if (stopping)
      return;
  }
}

std::string sanitise(std::string_view name) {
  std::string out;
  for (char c : name)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out.empty() ? "node" : out;
}

std::uint64_t flow_prefix_for(const options& opts, std::uint32_t pid) {
  constexpr std::uint64_t prefix_mask = (std::uint64_t{1} << (64 - flow_counter_bits)) - 1;
  if (opts.rank >= 0)
    return (static_cast<std::uint64_t>(opts.rank) + 1) & (prefix_mask >> 1);
  // FNV-1a of node name and pid; the top prefix bit marks "hashed".
  std::uint64_t h = 1469598103934665603ull;
  for (char c : opts.node + "/" + std::to_string(pid))
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return ((h ^ (h >> 29)) & (prefix_mask >> 1)) | ((prefix_mask >> 1) + 1);
}

std::once_flag atexit_once;

} // namespace

name_id intern(std::string_view text) {
  text = text.substr(0, max_string_bytes);
  auto& table = strings();
  std::lock_guard lock(table.mutex);
  auto it = table.ids.find(std::string(text));
  if (it != table.ids.end())
    return {it->second};
  table.texts.emplace_back(text);
  auto id = static_cast<std::uint32_t>(table.texts.size());
  table.ids.emplace(std::string(text), id);
  return {id};
}

expected<void> start(const options& opts) {
  std::call_once(atexit_once, [] { std::atexit([] { stop(); }); });
  std::lock_guard lifetime(lifetime_mutex);
  std::lock_guard lock(control_mutex);
  if (current)
    return make_error(errc::invalid_argument, "trace: a session is already recording to {}",
                      current->path);
  if (opts.directory.empty())
    return make_error(errc::invalid_argument, "trace: options.directory is empty");
  auto ring_bytes = std::min(opts.thread_buffer_bytes, opts.max_bytes);
  if (ring_bytes < 16 * sizeof(record))
    return make_error(errc::invalid_argument,
                      "trace: ring of {} bytes is too small; it must hold at least 16 records "
                      "({} bytes)",
                      ring_bytes, 16 * sizeof(record));
  std::error_code ec;
  std::filesystem::create_directories(opts.directory, ec);
  if (ec)
    return make_error(errc::io_error, "trace: cannot create directory {}: {}", opts.directory,
                      ec.message());

  auto s = std::make_unique<session>();
  s->opts = opts;
  s->ring_capacity = std::bit_floor(ring_bytes / sizeof(record));
  auto pid = static_cast<std::uint32_t>(::getpid());
  flow_prefix.store(flow_prefix_for(opts, pid), std::memory_order_relaxed);
  flow_counter.store(0, std::memory_order_relaxed);
  unbuffered_dropped.store(0, std::memory_order_relaxed);
  s->path = fmt::format("{}/trace-{}-{}.bin", opts.directory, sanitise(opts.node), pid);
  file_header header;
  header.pid = pid;
  header.flow_prefix = flow_prefix.load(std::memory_order_relaxed);
  header.mono_ns = now_ns();
  header.wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  header.node = opts.node;
  auto writer = file_writer::create(s->path, header);
  if (!writer)
    return writer.error();
  s->writer = std::move(*writer);
  s->stats.path = s->path;
  s->stats.file_bytes = s->writer.bytes_written();
  // The start-up clock pair also goes in as a record, so that a file merges
  // with others of the same host even without a measured offset.
  record sync;
  sync.type = event_type::clock_sync;
  sync.time_ns = header.mono_ns;
  sync.value = static_cast<std::uint64_t>(header.wall_ns);
  s->pending.push_back(sync);

  s->flusher = std::thread(flush_loop, s.get());
  current = std::move(s);
  generation.fetch_add(1, std::memory_order_acq_rel);
  detail::enabled_flag.store(true, std::memory_order_release);
  return {};
}

expected<void> start_from_environment(std::string_view node, std::int64_t rank) {
  const char* dir = std::getenv("TROUPE_TRACE_DIR");
  if (!dir || !*dir)
    return {};
  options opts;
  opts.directory = dir;
  opts.node = std::string(node);
  opts.rank = rank;
  if (const char* cap = std::getenv("TROUPE_TRACE_MAX_BYTES"); cap && *cap) {
    char* end = nullptr;
    auto v = std::strtoull(cap, &end, 10);
    if (*end != '\0' || v == 0)
      return make_error(errc::invalid_argument,
                        "trace: TROUPE_TRACE_MAX_BYTES is '{}' but must be a positive integer",
                        cap);
    opts.max_bytes = v;
  }
  return start(opts);
}

void stop() {
  std::lock_guard lifetime(lifetime_mutex);
  std::unique_ptr<session> s;
  {
    std::lock_guard lock(control_mutex);
    if (!current)
      return;
    detail::enabled_flag.store(false, std::memory_order_release);
    generation.fetch_add(1, std::memory_order_acq_rel);
    s = std::move(current);
  }
  // A thread that passed the enabled check just before the store above may
  // still append; the final drain takes whatever made it into a ring. Rings
  // outlive the session (threads hold them), so a late append is harmless.
  {
    std::lock_guard lock(s->flush_mutex);
    s->stopping = true;
  }
  s->wake.notify_all();
  s->flusher.join();
  s->writer.close();
  std::lock_guard lock(control_mutex);
  {
    std::lock_guard stats_lock(s->stats_mutex);
    last_stats = s->stats;
  }
  last_stats.buffer_bytes = 0;
  last_stats.threads = 0;
}

void flush() {
  // lifetime_mutex keeps the session alive (stop waits for it); the flusher
  // needs control_mutex, so that one is not held while waiting.
  std::lock_guard lifetime(lifetime_mutex);
  session* s;
  {
    std::lock_guard control(control_mutex);
    s = current.get();
  }
  if (!s)
    return;
  std::unique_lock lock(s->flush_mutex);
  auto request = ++s->flush_requested;
  s->wake.notify_all();
  s->flushed.wait(lock, [&] { return s->flush_done >= request || s->stopping; });
}

recorder_stats stats() {
  std::lock_guard lock(control_mutex);
  if (!current)
    return last_stats;
  recorder_stats out;
  {
    std::lock_guard stats_lock(current->stats_mutex);
    out = current->stats;
  }
  out.buffer_bytes = current->ring_bytes;
  out.threads = current->rings.size();
  return out;
}

void set_clock_offset(std::int64_t offset_ns, std::int64_t uncertainty_ns) noexcept {
  if (!enabled())
    return;
  record r;
  r.type = event_type::clock_offset;
  r.value = static_cast<std::uint64_t>(offset_ns);
  r.duration_ns = uncertainty_ns;
  detail::push(r);
}

namespace detail {

void push(record r) noexcept {
  thread_ring* ring = tl_ring;
  if (tl_generation != generation.load(std::memory_order_acquire)) [[unlikely]]
    ring = attach_thread();
  auto now = now_ns();
  if (!ring) [[unlikely]] {
    unbuffered_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  r.time_ns = now;
  if (r.type == event_type::data_write || r.type == event_type::data_read)
    r.duration_ns = std::max<std::int64_t>(0, now - r.duration_ns); // held start_ns
  r.thread = ring->thread_index;
  r.os_tid = ring->os_tid;
  ring->push(r);
}

std::uint64_t next_flow_id_slow() noexcept {
  auto n = flow_counter.fetch_add(1, std::memory_order_relaxed) + 1;
  return (flow_prefix.load(std::memory_order_relaxed) << flow_counter_bits) | (n & ((std::uint64_t{1} << flow_counter_bits) - 1));
}

} // namespace detail

} // namespace troupe::trace
