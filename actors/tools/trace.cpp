// troupe-trace: merges, summarises and draws the per-process trace files that
// a traced run writes (TROUPE_TRACE_DIR=dir, or trace::start). Run
// `troupe-trace --help` for the commands.
#include <cmath>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "troupe/actors/trace_report.hpp"

namespace {

constexpr const char* usage = R"(usage: troupe-trace COMMAND [OPTIONS] DIR_OR_FILE...

Inputs are trace files (trace-<node>-<pid>.bin) or directories holding them.
Damaged files are read up to the damage, with a warning naming the file and
byte offset; unreadable files are skipped with a warning.

commands:
  merge -o OUT.json INPUT...   Chrome trace-event JSON for Perfetto
                               (ui.perfetto.dev) or chrome://tracing: a process
                               per file, a track per actor, handlers as slices
                               named by message kind, flow arrows from each send
                               to its receive, data-plane transfers on
                               "<actor> data" tracks, every file shifted by its
                               recorded clock offset.
  summary [--json] INPUT...    Per actor: handled messages, busy time and
                               fraction (handler time / process span), bubble
                               fraction (1 - busy over the spans of the steps
                               it took part in). Per edge sender -> receiver:
                               messages, bytes, send -> receive latency p50,
                               p90, p99 (nearest rank, matched by flow id).
                               Totals, dropped records, and the share of
                               data-plane transfer time hidden behind compute
                               (overlapping handlers of other actors on the
                               same node).
  svg -o OUT.svg [--width PX] [--steps N | --from-ms A --to-ms B] [--actors TEXT] INPUT...
                               An SVG timeline: a row per actor, handler spans
                               coloured by message kind (legend below), send ->
                               receive lines, data-plane transfers as dark bars.
                               By default the last 2 training steps (from the
                               step numbers messages carry; the whole run if
                               none), so that a schedule can be read; actors
                               with nothing in the window are left out.

options:
  -o PATH      output file ('-' = stdout)
  --json       machine-readable summary
  --width PX   SVG width in pixels (default 1400)
  --steps N    draw the last N steps (0: the whole run; default 2)
  --from-ms A, --to-ms B
               draw the window [A, B) in ms since the trace's start
  --actors TEXT
               draw only the actors whose name contains TEXT
  -q           no warnings on stderr
  -h, --help   this text

examples:
  troupe-trace summary /tmp/run1
  troupe-trace merge -o run1.json /tmp/run1
  troupe-trace svg -o run1.svg /tmp/run1/trace-node0-*.bin

exit status: 0 on success, 1 when no input could be read or the output could
not be written, 2 on a usage error.
)";

int usage_error(const std::string& message) {
  fmt::print(stderr, "troupe-trace: {}\n(run troupe-trace --help for usage)\n", message);
  return 2;
}

bool write_output(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return true;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    fmt::print(stderr, "troupe-trace: cannot write {}\n", path);
    return false;
  }
  return true;
}

} // namespace

int main(int argc, char** argv) {
  using namespace troupe::trace;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty())
    return usage_error("missing command");
  if (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    fmt::print("{}", usage);
    return 0;
  }
  std::string command = args[0];
  if (command != "merge" && command != "summary" && command != "svg")
    return usage_error(fmt::format("unknown command '{}'", command));
  std::string output;
  bool json = false, quiet = false;
  svg_options svg;
  std::vector<std::string> inputs;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "-h" || a == "--help") {
      fmt::print("{}", usage);
      return 0;
    } else if (a == "-o") {
      if (++i == args.size())
        return usage_error("-o needs a path");
      output = args[i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "-q") {
      quiet = true;
    } else if (a == "--width") {
      if (++i == args.size())
        return usage_error("--width needs a number");
      try {
        svg.width = std::stoi(args[i]);
      } catch (...) {
        return usage_error(fmt::format("--width is '{}' but must be an integer", args[i]));
      }
      if (svg.width < 400 || svg.width > 20000)
        return usage_error(fmt::format("--width is {} but must be in [400, 20000]", svg.width));
    } else if (a == "--steps" || a == "--from-ms" || a == "--to-ms" || a == "--actors") {
      if (++i == args.size())
        return usage_error(fmt::format("{} needs a value", a));
      const auto& v = args[i];
      if (a == "--actors") {
        svg.actors = v;
        continue;
      }
      double number = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), number);
      if (ec != std::errc{} || end != v.data() + v.size() || !(number >= 0) || number > 1e12)
        return usage_error(fmt::format("{} is '{}' but must be a number >= 0", a, v));
      if (a == "--steps") {
        if (number != std::floor(number) || number > 1e9)
          return usage_error(fmt::format("--steps is '{}' but must be a whole number", v));
        svg.last_steps = static_cast<std::uint32_t>(number);
      } else if (a == "--from-ms") {
        svg.from_ms = number;
      } else {
        svg.to_ms = number;
      }
    } else if (a.starts_with("-") && a != "-") {
      return usage_error(fmt::format("unknown option '{}'", a));
    } else {
      inputs.push_back(a);
    }
  }
  if (inputs.empty())
    return usage_error("no input files or directories");
  if (svg.from_ms && svg.to_ms && *svg.from_ms >= *svg.to_ms)
    return usage_error(fmt::format("--from-ms ({}) must be below --to-ms ({})", *svg.from_ms, *svg.to_ms));
  if (command != "summary" && output.empty())
    return usage_error(fmt::format("{} needs -o OUTPUT", command));

  std::vector<std::string> warnings;
  auto files = read_trace_inputs(inputs, warnings);
  auto report_warnings = [&] {
    if (!quiet)
      for (const auto& w : warnings)
        fmt::print(stderr, "troupe-trace: warning: {}\n", w);
    warnings.clear();
  };
  report_warnings();
  if (!files) {
    fmt::print(stderr, "troupe-trace: {}\n", files.error().message());
    return 1;
  }
  std::string text;
  if (command == "merge")
    text = chrome_trace_json(*files, warnings);
  else if (command == "svg")
    text = render_svg(*files, svg, warnings);
  else {
    auto s = summarize(*files, warnings);
    text = json ? summary_json(s) : format_summary(s);
  }
  report_warnings();
  static const std::string to_stdout(1, '-');
  return write_output(output.empty() ? to_stdout : output, text) ? 0 : 1;
}
