// The recorder and the reader: round trip, the memory bound, damaged files,
// and a file whose writer was SIGKILLed.
#include "troupe/actors/trace.hpp"
#include "troupe/actors/trace_reader.hpp"

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace troupe;

namespace {

fs::path fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / fmt::format("troupe-trace-{}-{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::size_t count(const trace::trace_file& f, trace::event_type type) {
  return static_cast<std::size_t>(std::count_if(f.records.begin(), f.records.end(),
                                                [&](const auto& r) { return r.type == type; }));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

} // namespace

TEST(TraceFormat, Crc32MatchesTheBitwiseDefinitionAtEveryLengthAndAlignment) {
  auto bitwise = [](std::span<const std::byte> bytes) {
    std::uint32_t crc = ~0u;
    for (auto b : bytes) {
      crc ^= static_cast<std::uint8_t>(b);
      for (int k = 0; k < 8; ++k)
        crc = (crc & 1) ? 0xedb88320u ^ (crc >> 1) : crc >> 1;
    }
    return ~crc;
  };
  std::string check = "123456789";
  EXPECT_EQ(trace::crc32(std::as_bytes(std::span(check.data(), check.size()))), 0xcbf43926u);
  std::vector<std::byte> data(300);
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<std::byte>(i * 37 + 11);
  for (std::size_t offset = 0; offset < 8; ++offset)
    for (std::size_t n = 0; n + offset <= data.size(); n += 13) {
      auto part = std::span<const std::byte>(data).subspan(offset, n);
      ASSERT_EQ(trace::crc32(part), bitwise(part)) << "offset " << offset << ", " << n << " bytes";
    }
  // Continuing from a previous CRC equals one pass.
  auto all = std::span<const std::byte>(data);
  EXPECT_EQ(trace::crc32(all.subspan(100), trace::crc32(all.first(100))), trace::crc32(all));
}

TEST(TraceRecorder, RecordFlushReadRoundTrip) {
  auto dir = fresh_dir("roundtrip");
  trace::options opts;
  opts.directory = dir.string();
  opts.node = "node a";
  opts.rank = 3;
  ASSERT_TRUE(trace::start(opts));
  EXPECT_FALSE(trace::start(opts)); // one session at a time
  auto alice = trace::intern("alice");
  auto bob = trace::intern("bob");
  auto forward = trace::intern("forward");
  auto flow = trace::next_flow_id();
  EXPECT_EQ(flow >> trace::flow_counter_bits, 4u); // rank + 1
  EXPECT_NE(trace::next_flow_id(), flow);
  trace::message_sent(alice, {forward, bob, 1000, flow, 7, 2});
  std::thread([&] {
    trace::message_received(bob, {forward, alice, 1000, flow, 7, 2});
    trace::handler_scope h(bob, {forward, alice, 1000, flow, 7, 2});
    trace::data_write(bob, alice, 4096, flow, trace::now_ns() - 500);
  }).join();
  trace::set_clock_offset(-1234, 56);
  trace::counter(trace::intern("queue"), -5);
  trace::flush();
  EXPECT_GE(trace::stats().records, 6u);
  trace::stop();
  trace::stop(); // idempotent
  auto stats = trace::stats();

  auto file = trace::read_trace_file(stats.path);
  ASSERT_TRUE(file) << file.error().to_string();
  EXPECT_TRUE(file->warnings.empty()) << file->warnings.front();
  EXPECT_EQ(file->header.node, "node a");
  EXPECT_EQ(file->header.pid, static_cast<std::uint32_t>(::getpid()));
  EXPECT_EQ(stats.path, (dir / fmt::format("trace-node_a-{}.bin", ::getpid())).string());
  EXPECT_EQ(file->records.size(), stats.records);
  EXPECT_EQ(count(*file, trace::event_type::clock_sync), 1u);
  EXPECT_EQ(count(*file, trace::event_type::handler_start), 1u);
  EXPECT_EQ(count(*file, trace::event_type::handler_end), 1u);
  ASSERT_TRUE(file->has_clock_offset);
  EXPECT_EQ(file->clock_offset_ns, -1234);
  EXPECT_EQ(file->clock_uncertainty_ns, 56);
  bool saw_send = false, saw_write = false, saw_counter = false;
  for (const auto& r : file->records) {
    if (r.type == trace::event_type::message_sent) {
      saw_send = true;
      EXPECT_EQ(file->name(r.actor), "alice");
      EXPECT_EQ(file->name(r.peer), "bob");
      EXPECT_EQ(file->name(r.kind), "forward");
      EXPECT_EQ(r.value, 1000u);
      EXPECT_EQ(r.flow_id, flow);
      EXPECT_EQ(r.step, 7u);
      EXPECT_EQ(r.micro_batch, 2u);
    }
    if (r.type == trace::event_type::data_write) {
      saw_write = true;
      EXPECT_GE(r.duration_ns, 500);
      EXPECT_EQ(r.value, 4096u);
    }
    if (r.type == trace::event_type::counter) {
      saw_counter = true;
      EXPECT_EQ(static_cast<std::int64_t>(r.value), -5);
    }
  }
  EXPECT_TRUE(saw_send && saw_write && saw_counter);
}

TEST(TraceRecorder, DisabledRecordsNothingAndFlowIdsAreZero) {
  ASSERT_FALSE(trace::enabled());
  EXPECT_EQ(trace::next_flow_id(), 0u);
  trace::message_sent(trace::intern("x"), {trace::intern("k")}); // must not crash or allocate a ring
}

TEST(TraceRecorder, BurstFarBeyondTheCapIsDroppedAndCounted) {
  auto dir = fresh_dir("burst");
  trace::options opts;
  opts.directory = dir.string();
  opts.max_bytes = 64 * 1024; // 1024 records
  opts.flush_interval = std::chrono::hours(1); // nothing drains until stop()
  ASSERT_TRUE(trace::start(opts));
  auto actor = trace::intern("burster");
  auto kind = trace::intern("tick");
  constexpr std::size_t burst = 100000;
  auto t0 = trace::now_ns();
  for (std::size_t i = 0; i < burst; ++i)
    trace::message_sent(actor, {kind, actor, i});
  auto per_record = double(trace::now_ns() - t0) / burst;
  EXPECT_LE(trace::stats().buffer_bytes, opts.max_bytes);
  EXPECT_EQ(trace::stats().threads, 1u);
  // A second thread does not fit under the cap: its records are dropped too.
  std::thread([&] { trace::message_sent(actor, {kind}); }).join();
  EXPECT_LE(trace::stats().buffer_bytes, opts.max_bytes);
  trace::stop();
  auto stats = trace::stats();
  EXPECT_EQ(stats.dropped, burst - 1024 + 1);

  auto file = trace::read_trace_file(stats.path);
  ASSERT_TRUE(file) << file.error().to_string();
  EXPECT_EQ(count(*file, trace::event_type::message_sent), 1024u);
  EXPECT_EQ(file->dropped, burst - 1024 + 1);
  // The oldest records are kept: the ring drops the newest when full.
  std::uint64_t expected_bytes = 0;
  for (const auto& r : file->records) {
    if (r.type == trace::event_type::message_sent) {
      EXPECT_EQ(r.value, expected_bytes++);
    }
  }
  fmt::print("per-record cost with a full ring: {:.1f} ns\n", per_record);
}

TEST(TraceRecorder, PerRecordCost) {
  auto dir = fresh_dir("cost");
  trace::options opts;
  opts.directory = dir.string();
  opts.flush_interval = std::chrono::milliseconds(5);
  ASSERT_TRUE(trace::start(opts));
  auto actor = trace::intern("timer");
  auto kind = trace::intern("tick");
  // Batches of 8192 records stay under the ring's 16384, so that nothing is
  // dropped; only the recording calls are timed, not the flushes between.
  constexpr std::size_t batch = 8192, batches = 24, n = batch * batches;
  std::int64_t elapsed = 0;
  for (std::size_t b = 0; b < batches; ++b) {
    auto t0 = trace::now_ns();
    for (std::size_t i = 0; i < batch; ++i)
      trace::message_sent(actor, {kind, actor, i, i});
    elapsed += trace::now_ns() - t0;
    trace::flush();
  }
  trace::stop();
  EXPECT_EQ(trace::stats().dropped, 0u);
  EXPECT_EQ(trace::stats().records, n + 1);
  fmt::print("per-record cost: {:.1f} ns\n", double(elapsed) / n);
  auto t1 = trace::now_ns();
  for (std::size_t i = 0; i < n; ++i)
    trace::message_sent(actor, {kind, actor, i, i});
  fmt::print("per-record cost while disabled: {:.2f} ns\n", double(trace::now_ns() - t1) / n);
}

TEST(TraceReader, TruncatedAnywhereKeepsTheValidPrefix) {
  auto dir = fresh_dir("truncate");
  trace::options opts;
  opts.directory = dir.string();
  ASSERT_TRUE(trace::start(opts));
  auto actor = trace::intern("truncated");
  for (int chunk = 0; chunk < 4; ++chunk) {
    for (int i = 0; i < 10; ++i)
      trace::message_sent(actor, {actor, actor, std::uint64_t(i)});
    trace::flush();
  }
  trace::stop();
  auto bytes = slurp(trace::stats().path);
  auto whole = trace::read_trace_file(trace::stats().path);
  ASSERT_TRUE(whole);
  ASSERT_GE(whole->chunks, 4u);
  auto cut_path = (dir / "cut.bin").string();
  std::size_t previous_records = 0, clean_cuts = 0;
  for (std::size_t length = 0; length <= bytes.size(); length += (length < 200 ? 1 : 37)) {
    {
      std::ofstream out(cut_path, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(length));
    }
    auto file = trace::read_trace_file(cut_path);
    if (length < trace::file_header_bytes) {
      ASSERT_FALSE(file) << length;
      EXPECT_NE(file.error().message().find("cut.bin"), std::string::npos);
      continue;
    }
    ASSERT_TRUE(file) << length << ": " << file.error().to_string();
    EXPECT_GE(file->records.size(), previous_records); // a longer prefix never loses records
    EXPECT_LE(file->records.size(), whole->records.size());
    previous_records = file->records.size();
    if (file->warnings.empty()) {
      ++clean_cuts; // only a cut at a chunk boundary reads without a warning
    } else {
      EXPECT_NE(file->warnings.back().find("offset"), std::string::npos);
      EXPECT_NE(file->warnings.back().find("cut.bin"), std::string::npos);
    }
  }
  EXPECT_LE(clean_cuts, whole->chunks + 1);
}

TEST(TraceReader, BadMagicCorruptionAndUndefinedIdsAreReportedNotCrashed) {
  auto dir = fresh_dir("corrupt");
  auto path = (dir / "trace-x-1.bin").string();
  trace::file_header header;
  header.node = "x";
  {
    auto w = trace::file_writer::create(path, header);
    ASSERT_TRUE(w);
    std::string name = "good";
    trace::string_entry s{1, name};
    trace::record ok, bad_id, bad_type;
    ok.type = trace::event_type::message_sent;
    ok.actor = 1;
    bad_id = ok;
    bad_id.peer = 99;
    bad_type = ok;
    bad_type.type = static_cast<trace::event_type>(200);
    std::vector<trace::record> records{ok, bad_id, bad_type, ok};
    ASSERT_TRUE(w->write_chunk({&s, 1}, records));
    ASSERT_TRUE(w->write_chunk({}, records));
  }
  auto file = trace::read_trace_file(path);
  ASSERT_TRUE(file);
  EXPECT_EQ(file->records.size(), 4u);
  ASSERT_EQ(file->warnings.size(), 4u);
  EXPECT_NE(file->warnings[0].find("peer string id 99 is not defined"), std::string::npos);
  EXPECT_NE(file->warnings[1].find("record type is 200"), std::string::npos);

  // A flipped byte in the second chunk's payload: the first chunk survives.
  auto bytes = slurp(path);
  bytes[bytes.size() - 10] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  file = trace::read_trace_file(path);
  ASSERT_TRUE(file);
  EXPECT_EQ(file->records.size(), 2u);
  EXPECT_NE(file->warnings.back().find("checksum mismatch"), std::string::npos);

  bytes[0] = 'X';
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  file = trace::read_trace_file(path);
  ASSERT_FALSE(file);
  EXPECT_NE(file.error().message().find("bad magic"), std::string::npos);

  std::vector<std::string> warnings;
  auto inputs = trace::read_trace_inputs(std::vector<std::string>{dir.string()}, warnings);
  EXPECT_FALSE(inputs);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("trace-x-1.bin"), std::string::npos);
  EXPECT_FALSE(trace::read_trace_file((dir / "missing.bin").string()));
}

TEST(TraceReader, FileOfASigkilledWriterIsReadable) {
  auto dir = fresh_dir("sigkill");
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    trace::options opts;
    opts.directory = dir.string();
    opts.node = "victim";
    opts.flush_interval = std::chrono::milliseconds(1);
    if (!trace::start(opts))
      ::_exit(2);
    auto actor = trace::intern("victim");
    for (std::uint64_t i = 0;; ++i) { // runs until killed
      trace::message_sent(actor, {actor, actor, i, i});
      if (i % 64 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  auto path = dir / fmt::format("trace-victim-{}.bin", child);
  // Wait (bounded) until a few chunks are on disk, then kill it mid-run.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::error_code ec;
  while (std::chrono::steady_clock::now() < deadline &&
         !(fs::exists(path, ec) && fs::file_size(path, ec) > 64 * 1024))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  auto file = trace::read_trace_file(path.string());
  ASSERT_TRUE(file) << file.error().to_string();
  EXPECT_GT(count(*file, trace::event_type::message_sent), 500u);
  EXPECT_EQ(file->header.node, "victim");
  // Records are complete and in order (a full ring may have dropped some).
  std::uint64_t next = 0;
  for (const auto& r : file->records)
    if (r.type == trace::event_type::message_sent) {
      EXPECT_GE(r.value, next);
      next = r.value + 1;
    }
}
