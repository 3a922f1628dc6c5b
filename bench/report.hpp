#pragma once
// Benchmark output shared by every program in bench/: a readable table in
// the nccl-tests manner and, with --json, one JSON object per line:
//   {"bench":..., "case":..., "metric":..., "value":..., "unit":...,
//    "baseline":..., "baseline_value":..., "ratio":..., ...}
// `baseline*` appear only where a peer or physical limit was measured in the
// same run.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/command_line.hpp"

#include "troupe/tensor/cpu_blas.hpp"
#include "troupe/tensor/cpu_vector_kernels.hpp"

namespace troupe::bench {

/// One measured figure, optionally beside the peer's figure from the same run.
struct row {
  std::string case_name;
  std::string metric;
  double value = 0;
  std::string unit;
  std::string baseline;                  ///< peer or limit name, empty if none
  std::optional<double> baseline_value;  ///< same metric and unit as value
  std::string note;                      ///< correctness column or remark
};

/// Collects rows and prints them at the end (table or JSON lines).
class report {
public:
  report(std::string bench, int argc, char** argv) : bench_(std::move(bench)) {
    for (int i = 1; i < argc; ++i)
      if (std::string_view(argv[i]) == "--json")
        json_ = true;
    // PyTorch runs on the same OpenBLAS, whose own choice on this CPU is its
    // slowest kernel (troupe/tensor/cpu_blas.hpp): every process this
    // benchmark starts (peers and troupe's own ranks) gets troupe's kernel.
    // Where troupe runs oneDNN's matmul instead, the line says so.
    auto kernel = std::string(blas_kernel());
    if (!kernel.empty())
      ::setenv("OPENBLAS_CORETYPE", kernel.c_str(), 0);
    const char* chosen = std::getenv("OPENBLAS_CORETYPE");
    note("OpenBLAS kernel: {} (OPENBLAS_CORETYPE={} for every process this benchmark starts, peers' GEMMs run "
         "it); troupe's float32 GEMM: {}; troupe's vector kernels: {}",
         kernel, chosen ? chosen : "unset", float32_gemm(), cpu_vector_kernels());
  }

  bool json() const noexcept { return json_; }
  void add(row r) { rows_.push_back(std::move(r)); }
  /// The row added last (add() must have been called).
  const row& last() const { return rows_.back(); }

  /// Prints progress or context lines (to stderr in JSON mode so stdout stays
  /// machine-readable).
  template <class... Ts> void note(fmt::format_string<Ts...> format, Ts&&... args) const {
    auto text = fmt::format(format, std::forward<Ts>(args)...);
    std::fputs(("# " + text + "\n").c_str(), json_ ? stderr : stdout);
  }

  void print() const {
    if (json_) {
      for (const auto& r : rows_) {
        auto line = fmt::format(R"({{"bench":"{}","case":"{}","metric":"{}","value":{:.6g},"unit":"{}")",
                                bench_, r.case_name, r.metric, r.value, r.unit);
        if (r.baseline_value) {
          line += fmt::format(R"(,"baseline":"{}","baseline_value":{:.6g},"ratio":{:.4g})", r.baseline,
                              *r.baseline_value, r.value / *r.baseline_value);
        }
        if (!r.note.empty())
          line += fmt::format(R"(,"note":"{}")", r.note);
        fmt::print("{}}}\n", line);
      }
      return;
    }
    fmt::print("# {}\n", bench_);
    std::size_t width = 34; // the case column, widened for a longer name
    for (const auto& r : rows_)
      width = std::max(width, r.case_name.size());
    fmt::print("{:<{}} {:<16} {:>12} {:<10} {:<22} {:>12} {:>7}  {}\n", "case", width, "metric", "value", "unit",
               "baseline", "baseline", "ratio", "note");
    for (const auto& r : rows_) {
      auto base = r.baseline_value ? fmt::format("{:>12.4g}", *r.baseline_value) : fmt::format("{:>12}", "-");
      auto ratio = r.baseline_value ? fmt::format("{:>7.2f}", r.value / *r.baseline_value) : fmt::format("{:>7}", "-");
      fmt::print("{:<{}} {:<16} {:>12.4g} {:<10} {:<22} {} {}  {}\n", r.case_name, width, r.metric, r.value,
                 r.unit, r.baseline.empty() ? "-" : r.baseline, base, ratio, r.note);
    }
  }

private:
  std::string bench_;
  bool json_ = false;
  std::vector<row> rows_;
};

/// Median of samples (by copy).
inline double median(std::vector<double> xs) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

/// Seconds since an arbitrary epoch, monotonic.
inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

/// Seconds per call of `fn`: one warm-up call, then as many calls as fill
/// `seconds` of wall time.
template <class F> double time_per_call(F&& fn, double seconds = 0.2) {
  fn();
  long calls = 0;
  auto start = now_seconds();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = now_seconds() - start;
  } while (elapsed < seconds);
  return elapsed / static_cast<double>(calls);
}

/// Ends the program with 2 when `flags` rejected a value (naming it).
inline void exit_on_bad_value(const command_line& flags) {
  if (flags.rejected().empty())
    return;
  fmt::print(stderr, "{}: {}\n", flags.program(), fmt::join(flags.rejected(), "; "));
  std::exit(2);
}

/// Command-line value of `--name=value`, or `fallback`.
inline std::string option(int argc, char** argv, std::string_view name, std::string fallback) {
  return command_line(argc, argv).text(name, std::move(fallback));
}

/// Command-line list `--name=1,2,4` of positive integers, or `fallback`'s;
/// a bad item is reported (naming the option) and ends the program with 2.
inline std::vector<std::size_t> list_option(int argc, char** argv, std::string_view name,
                                            std::vector<std::size_t> fallback) {
  command_line flags(argc, argv);
  auto values = flags.integers(name, {});
  exit_on_bad_value(flags);
  return values.empty() ? fallback : std::vector<std::size_t>(values.begin(), values.end());
}

/// Checks a benchmark's command line before anything runs: every argument
/// must be `--json` or one of `known`, written "quick" for a switch and
/// "rounds=" for an option with a value. `--help` lists them and exits 0;
/// anything else is reported, naming it, and ends the program with 2 (a
/// mistyped flag must not run a ten-minute benchmark with its defaults).
inline void check_flags(std::string_view bench, int argc, char** argv,
                        std::initializer_list<std::string_view> known) {
  std::string listing = "--json";
  for (auto k : known)
    listing += fmt::format(" --{}{}", k, k.ends_with('=') ? "VALUE" : "");
  for (int i = 1; i < argc; ++i) {
    std::string_view arg(argv[i]);
    if (arg == "--help" || arg == "-h") {
      fmt::print("usage: {} [{}]\n", bench, listing);
      std::exit(0);
    }
    bool ok = arg == "--json";
    for (auto k : known) {
      if (!arg.starts_with("--") || ok)
        continue;
      auto body = arg.substr(2);
      ok = k.ends_with('=') ? body.starts_with(k) : body == k;
    }
    if (!ok) {
      fmt::print(stderr, "{}: unknown argument '{}' (options: {})\n", bench, arg, listing);
      std::exit(2);
    }
  }
}

/// `--name=X` as an integer in [min, max], or `fallback`; anything else is
/// reported, naming the option, and ends the program with 2.
inline std::int64_t int_option(int argc, char** argv, std::string_view name, std::int64_t fallback,
                               std::int64_t min, std::int64_t max) {
  command_line flags(argc, argv);
  auto value = flags.integer(name, fallback, min, max);
  exit_on_bad_value(flags);
  return value;
}

/// `--name=X` as a number in [min, max], as int_option.
inline double number_option(int argc, char** argv, std::string_view name, double fallback, double min, double max) {
  command_line flags(argc, argv);
  auto value = flags.number(name, fallback, min, max);
  exit_on_bad_value(flags);
  return value;
}

} // namespace troupe::bench
