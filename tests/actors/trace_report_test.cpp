// Merge, summary and SVG on a synthetic two-node trace whose numbers are
// worked out by hand below.
#include "troupe/actors/trace_report.hpp"

#include <filesystem>
#include <regex>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace troupe;
using trace::event_type;

namespace {

// Two processes. Node n0 runs stage0 and optimizer; node n1 runs stage1,
// whose clock is 1000 ns behind (offset +1000). On the merged timeline
// (ns from the first record):
//
//   stage0    handler forward step 0 [0, 1000), sends F1 (100 B) at 400
//             handler forward step 1 [2000, 3000), sends F2 (300 B) at 2500
//             data write to stage1, 1000 B, [2000, 4000)
//   optimizer handler update [2500, 3500)
//   stage1    receives F1 at 1000, handler forward step 0 [1100, 2600)
//             receives F2 at 3000, handler forward step 1 [3200, 4700)
//             data read from stage0, 1000 B, [4000, 5000)
//
// Without the offset stage1 would receive F1 at 0, before it was sent.
constexpr std::uint64_t f1 = 0x100000000001, f2 = 0x100000000002, f3 = 0x100000000003;

trace::record rec(event_type type, std::int64_t t, std::uint32_t actor, std::uint32_t kind = 0,
                  std::uint32_t peer = 0, std::uint64_t value = 0, std::uint64_t flow = 0,
                  std::uint32_t step = trace::no_step) {
  trace::record r;
  r.type = type;
  r.time_ns = t;
  r.actor = actor;
  r.kind = kind;
  r.peer = peer;
  r.value = value;
  r.flow_id = flow;
  r.step = step;
  return r;
}

void write(const fs::path& path, const trace::file_header& header,
           const std::vector<std::string>& names, const std::vector<trace::record>& records) {
  auto w = trace::file_writer::create(path.string(), header);
  ASSERT_TRUE(w);
  std::vector<trace::string_entry> strings;
  for (std::size_t i = 0; i < names.size(); ++i)
    strings.push_back({static_cast<std::uint32_t>(i + 1), names[i]});
  // Two chunks, the second with the later half of the records.
  auto half = records.size() / 2;
  ASSERT_TRUE(w->write_chunk(strings, std::span(records).first(half)));
  ASSERT_TRUE(w->write_chunk({}, std::span(records).subspan(half)));
}

std::vector<trace::trace_file> synthetic_trace() {
  auto dir = fs::temp_directory_path() / fmt::format("troupe-trace-report-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  enum : std::uint32_t { stage0 = 1, stage1, optimizer, forward, update };
  std::vector<std::string> names{"stage0", "stage1", "optimizer", "forward", "update"};

  trace::file_header a{100, 1, 1'000'000'000, 5000, "n0"};
  auto at = [](std::int64_t rel) { return rel + 5000; }; // n0's steady clock
  write(dir / "trace-n0-100.bin", a, names,
        {rec(event_type::handler_start, at(0), stage0, forward, 0, 0, 0, 0),
         rec(event_type::message_sent, at(400), stage0, forward, stage1, 100, f1, 0),
         rec(event_type::handler_end, at(1000), stage0, forward),
         rec(event_type::handler_start, at(2000), stage0, forward, 0, 0, 0, 1),
         rec(event_type::message_sent, at(2500), stage0, forward, stage1, 300, f2, 1),
         rec(event_type::handler_start, at(2500), optimizer, update),
         rec(event_type::handler_end, at(3000), stage0, forward),
         rec(event_type::handler_end, at(3500), optimizer, update),
         [&] {
           auto r = rec(event_type::data_write, at(4000), stage0, 0, stage1, 1000, f3);
           r.duration_ns = 2000;
           return r;
         }()});

  trace::file_header b{200, 2, 1'000'000'000, 0, "n1"};
  auto bt = [](std::int64_t rel) { return rel - 1000; }; // n1's steady clock, 1000 ns behind
  auto offset = rec(event_type::clock_offset, bt(1000), 0, 0, 0, 1000);
  offset.duration_ns = 20;
  auto worse = rec(event_type::clock_offset, bt(1000), 0, 0, 0, 999'999);
  worse.duration_ns = 500; // more uncertain: ignored
  write(dir / "trace-n1-200.bin", b, names,
        {worse, offset,
         rec(event_type::message_received, bt(1000), stage1, forward, stage0, 100, f1, 0),
         rec(event_type::handler_start, bt(1100), stage1, forward, stage0, 100, f1, 0),
         rec(event_type::handler_end, bt(2600), stage1, forward),
         rec(event_type::message_received, bt(3000), stage1, forward, stage0, 300, f2, 1),
         rec(event_type::handler_start, bt(3200), stage1, forward, stage0, 300, f2, 1),
         rec(event_type::handler_end, bt(4700), stage1, forward), [&] {
           auto r = rec(event_type::data_read, bt(5000), stage1, 0, stage0, 1000, f3);
           r.duration_ns = 1000;
           return r;
         }()});
  std::vector<std::string> warnings;
  auto files = trace::read_trace_inputs(std::vector<std::string>{dir.string()}, warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  fs::remove_all(dir);
  return std::move(*files);
}

// The "ts" of the one event line containing `needle`.
double ts_of(const std::string& json, const std::string& needle) {
  auto at = json.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  auto line_start = json.rfind('\n', at) + 1;
  auto line = json.substr(line_start, json.find('\n', at) - line_start);
  std::smatch m;
  EXPECT_TRUE(std::regex_search(line, m, std::regex(R"x("ts":([0-9.]+))x"))) << line;
  return std::stod(m[1]);
}

/// The actors drawn as rows of `svg`, in order.
std::vector<std::string> svg_rows(const std::string& svg) {
  std::regex row(R"x(<g class="row" data-actor="([^"]+)">)x");
  std::vector<std::string> rows;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), row); it != std::sregex_iterator(); ++it)
    rows.push_back((*it)[1]);
  return rows;
}

// The default window is the last steps (the synthetic trace has steps 0 and
// 1); a window can be chosen in ms, and actors filtered by name; actors with
// nothing in the window are left out.
TEST(TraceReport, SvgDrawsAWindowOfStepsOrTimeAndChosenActors) {
  auto files = synthetic_trace();
  std::vector<std::string> warnings;
  auto both = trace::render_svg(files, {}, warnings);
  EXPECT_NE(both.find("steps 0 to 1"), std::string::npos);
  trace::svg_options last;
  last.last_steps = 1;
  auto one = trace::render_svg(files, last, warnings);
  EXPECT_NE(one.find("step 1 ("), std::string::npos);
  // Step 1 begins at 2000 ns: stage0's step-0 forward (0 to 1000 ns) is out.
  EXPECT_EQ(std::count(one.begin(), one.end(), '\n') < std::count(both.begin(), both.end(), '\n'), true);
  EXPECT_EQ(svg_rows(one), (std::vector<std::string>{"optimizer", "stage0", "stage1"}));

  trace::svg_options early;
  early.from_ms = 0.0001; // 100 to 200 ns: only stage0's first forward
  early.to_ms = 0.0002;
  auto window = trace::render_svg(files, early, warnings);
  EXPECT_EQ(svg_rows(window), (std::vector<std::string>{"stage0"}));
  EXPECT_NE(window.find("0.000 to 0.000 ms"), std::string::npos);

  trace::svg_options stages;
  stages.actors = "stage";
  EXPECT_EQ(svg_rows(trace::render_svg(files, stages, warnings)), (std::vector<std::string>{"stage0", "stage1"}));
  trace::svg_options none;
  none.actors = "no such actor";
  EXPECT_TRUE(svg_rows(trace::render_svg(files, none, warnings)).empty());
}

} // namespace

TEST(TraceReport, SummaryMatchesHandComputedValues) {
  auto files = synthetic_trace();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[1].clock_offset_ns, 1000);
  std::vector<std::string> warnings;
  auto s = trace::summarize(files, warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_DOUBLE_EQ(s.span_ns, 5000);
  ASSERT_EQ(s.actors.size(), 3u);
  std::map<std::string, trace::actor_summary> by_name;
  for (const auto& a : s.actors)
    by_name[a.actor] = a;
  // n0's file spans [0, 4000); n1's [1000, 5000).
  EXPECT_DOUBLE_EQ(by_name["stage0"].busy_ns, 2000);
  EXPECT_DOUBLE_EQ(by_name["stage0"].busy_fraction, 0.5);
  EXPECT_DOUBLE_EQ(by_name["optimizer"].busy_fraction, 0.25);
  EXPECT_DOUBLE_EQ(by_name["stage1"].busy_fraction, 0.75);
  EXPECT_EQ(by_name["stage1"].handled, 2u);
  // Step 0 spans [0, 2600), step 1 [2000, 4700): 5300 ns in all.
  ASSERT_TRUE(by_name["stage0"].bubble_fraction);
  EXPECT_DOUBLE_EQ(*by_name["stage0"].bubble_fraction, 1 - 2000.0 / 5300);
  EXPECT_DOUBLE_EQ(*by_name["stage1"].bubble_fraction, 1 - 3000.0 / 5300);
  EXPECT_FALSE(by_name["optimizer"].bubble_fraction);

  ASSERT_EQ(s.edges.size(), 1u);
  const auto& e = s.edges[0];
  EXPECT_EQ(e.sender, "stage0");
  EXPECT_EQ(e.receiver, "stage1");
  EXPECT_EQ(e.messages, 2u);
  EXPECT_EQ(e.bytes, 400u);
  EXPECT_EQ(e.matched, 2u);
  EXPECT_DOUBLE_EQ(e.p50_ns, 500); // latencies 600 (F1) and 500 (F2), nearest rank
  EXPECT_DOUBLE_EQ(e.p90_ns, 600);
  EXPECT_DOUBLE_EQ(e.p99_ns, 600);
  EXPECT_EQ(s.message_bytes, 400u);
  EXPECT_EQ(s.data_write_bytes, 1000u);
  EXPECT_EQ(s.data_read_bytes, 1000u);
  // The write [2000, 4000) overlaps optimizer's [2500, 3500) (stage0's own
  // handler does not count); the read on n1 overlaps nothing: 1000 / 3000.
  ASSERT_TRUE(s.hidden_communication);
  EXPECT_DOUBLE_EQ(*s.hidden_communication, 1.0 / 3);

  auto text = trace::format_summary(s);
  EXPECT_NE(text.find("stage0 -> stage1"), std::string::npos) << text;
  EXPECT_NE(text.find("33.3%"), std::string::npos) << text;
  EXPECT_FALSE(s.hidden_reduction); // no "allreduce" handlers
  EXPECT_EQ(text.find("gradient reduction"), std::string::npos) << text;
  auto json = trace::summary_json(s);
  EXPECT_NE(json.find("\"p50_ns\":500"), std::string::npos) << json;
  EXPECT_NE(json.find("\"hidden_reduction\":null"), std::string::npos) << json;
}

// Data parallelism: replica0's backward [0, 1000) and [2000, 3000); its
// reducer's allreduce [500, 1500) and [2800, 3200): hidden 500 + 200 of
// 1400 ns. A second process's allreduce [0, 1000) with no backward there
// (another replica's backward does not hide it): 700 / 2400 in all.
TEST(TraceReport, GradientReductionHiddenBehindBackward) {
  auto dir = fs::temp_directory_path() / fmt::format("troupe-trace-reduction-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  enum : std::uint32_t { replica = 1, reducer, backward, allreduce };
  std::vector<std::string> names{"w0/cpu/replica0", "w0/cpu/reducer0", "backward", "allreduce"};
  write(dir / "trace-w0-1.bin", {1, 0, 1'000'000'000, 0, "w0"}, names,
        {rec(event_type::handler_start, 0, replica, backward), rec(event_type::handler_start, 500, reducer, allreduce),
         rec(event_type::handler_end, 1000, replica, backward), rec(event_type::handler_end, 1500, reducer, allreduce),
         rec(event_type::handler_start, 2000, replica, backward),
         rec(event_type::handler_start, 2800, reducer, allreduce),
         rec(event_type::handler_end, 3000, replica, backward), rec(event_type::handler_end, 3200, reducer, allreduce)});
  write(dir / "trace-w1-2.bin", {2, 1, 1'000'000'000, 0, "w1"}, names,
        {rec(event_type::handler_start, 0, reducer, allreduce), rec(event_type::handler_end, 1000, reducer, allreduce)});
  std::vector<std::string> warnings;
  auto files = trace::read_trace_inputs(std::vector<std::string>{dir.string()}, warnings);
  fs::remove_all(dir);
  ASSERT_TRUE(files);
  auto s = trace::summarize(*files, warnings);
  ASSERT_TRUE(s.hidden_reduction);
  EXPECT_DOUBLE_EQ(*s.hidden_reduction, 700.0 / 2400);
  auto text = trace::format_summary(s);
  EXPECT_NE(text.find("# gradient reduction hidden behind backward: 29.2%\n"), std::string::npos) << text;
}

TEST(TraceReport, MergeAppliesClockOffsetsAndPairsFlows) {
  auto files = synthetic_trace();
  std::vector<std::string> warnings;
  auto json = trace::chrome_trace_json(files, warnings);
  EXPECT_TRUE(warnings.empty());
  // The offset puts the receive after the send.
  EXPECT_DOUBLE_EQ(ts_of(json, "\"send forward\""), 0.4);
  EXPECT_DOUBLE_EQ(ts_of(json, "\"recv forward\""), 1.0);
  EXPECT_NE(json.find(R"x("name":"process_name","ph":"M","pid":2,"args":{"name":"n1 (pid 200)"})x"),
            std::string::npos);
  // Every flow start has exactly one finish with the same id: F1, F2 as
  // messages, F3 as a transfer.
  std::regex flow(R"x("ph":"([sf])"(?:,"bp":"e")?,"id":"(0x[0-9a-f]+)")x");
  std::map<std::string, std::string> phases;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), flow); it != std::sregex_iterator(); ++it)
    phases[(*it)[2]] += (*it)[1];
  EXPECT_EQ(phases, (std::map<std::string, std::string>{{fmt::format("0x{:x}", f1), "sf"},
                                                        {fmt::format("0x{:x}", f2), "sf"},
                                                        {fmt::format("0x{:x}", f3), "sf"}}));
  // Handlers are complete events named by kind, with durations in us.
  EXPECT_NE(json.find(R"x("name":"forward","cat":"handler","ph":"X","ts":1.100,"dur":1.500)x"),
            std::string::npos);
  EXPECT_NE(json.find(R"x("name":"write to stage1","cat":"data","ph":"X","ts":2.000,"dur":2.000)x"),
            std::string::npos);
}

TEST(TraceReport, SvgIsWellFormedWithOneRowPerActor) {
  auto files = synthetic_trace();
  std::vector<std::string> warnings;
  auto svg = trace::render_svg(files, {}, warnings);
  // Well-formed: every tag closes in order (a small checker; no XML library
  // in the build).
  std::vector<std::string> open;
  std::regex tag(R"x(<(/?)([A-Za-z?][^\s/>]*)[^>]*?(/?)>)x");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    auto name = (*it)[2].str();
    if (name.starts_with("?"))
      continue;
    if ((*it)[1] == "/") {
      ASSERT_FALSE(open.empty()) << name;
      ASSERT_EQ(open.back(), name);
      open.pop_back();
    } else if ((*it)[3] != "/") {
      open.push_back(name);
    }
  }
  EXPECT_TRUE(open.empty());
  std::regex row(R"x(<g class="row" data-actor="([^"]+)">)x");
  std::vector<std::string> rows;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), row); it != std::sregex_iterator(); ++it)
    rows.push_back((*it)[1]);
  EXPECT_EQ(rows, (std::vector<std::string>{"optimizer", "stage0", "stage1"}));
  EXPECT_NE(svg.find(">forward</text>"), std::string::npos); // legend
  EXPECT_NE(svg.find(">update</text>"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
}
