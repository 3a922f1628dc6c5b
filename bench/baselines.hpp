#pragma once
// Peers measured in the same run as troupe's transport benchmark:
// ucx_perftest (the UCX engine's own ceiling) and PyTorch RPC
// (bench/peers/rpc_latency.py).
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "peer_process.hpp"

namespace troupe::bench {

/// Waits for a peer's processes to wind down before troupe measures again:
/// PyTorch's workers were still exiting when its script returned, and
/// troupe's one-process pipeline baseline measured at once lost up to a
/// third.
inline void settle_after_peer() { std::this_thread::sleep_for(std::chrono::seconds(3)); }

/// Runs a shell command with a time limit and returns its stdout.
inline std::string run_command(const std::string& command, int timeout_seconds) {
  auto line = fmt::format("timeout {} {} 2>/dev/null", timeout_seconds, command);
  std::string output;
  if (FILE* pipe = ::popen(line.c_str(), "r")) {
    char buffer[4096];
    while (auto n = std::fread(buffer, 1, sizeof buffer, pipe))
      output.append(buffer, n);
    ::pclose(pipe);
  }
  return output;
}

/// The numbers of ucx_perftest's "Final:" line, or empty.
inline std::vector<double> perftest_final(const std::string& output) {
  std::vector<double> numbers;
  auto at = output.rfind("Final:");
  if (at == std::string::npos)
    return numbers;
  std::istringstream in(output.substr(at + 6));
  double x;
  while (in >> x)
    numbers.push_back(x);
  return numbers;
}

/// One ucx_perftest run between two processes on 127.0.0.1.
struct perftest_options {
  std::string transports;  ///< UCX_TLS
  std::string test;        ///< ucp_am_bw or ucp_am_lat
  std::size_t bytes = 0;
  int iterations = 0;
  int window = 1;          ///< -O and -w: outstanding sends, warm-up iterations
  int port = 0;
  /// "poll" (perftest's default: both processes spin on their workers) or
  /// "sleep" (each waits on its worker's event fd when idle, as troupe's
  /// transport thread does).
  std::string wait_mode = "poll";
  /// The built bench/perftest_written_buffers.c, preloaded into both
  /// processes so that the buffers perftest sends from and receives into
  /// hold data; empty: perftest as shipped.
  std::string written_buffers_shim = {};
};

/// The line the preloaded shim prints once per buffer it wrote.
inline constexpr const char* perftest_shim_mark = "troupe-perftest-shim: wrote ";

/// Runs ucx_perftest (the loopback interface only) and returns GB/s (10^9
/// bytes) for bandwidth, or the round trip in µs (twice its one-way figure)
/// for latency; nullopt when ucx_perftest is missing or failed, or when
/// written buffers were asked for and the client did not report writing its
/// buffer (the shim did not load: no figure rather than the wrong one).
inline std::optional<double> ucx_perftest(const perftest_options& o) {
  // Loopback only, like troupe's nodes on 127.0.0.1: without it UCX adds a
  // second TCP lane on the machine's external interface (more bandwidth,
  // and an address these benchmarks must not use; docs/performance.md, "Figures behind defaults").
  auto env = fmt::format("UCX_TLS={} UCX_NET_DEVICES=lo UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n", o.transports);
  if (!o.written_buffers_shim.empty())
    env += fmt::format(" LD_PRELOAD={}", o.written_buffers_shim);
  // The server serves one run and exits; start it in the background, give it
  // a moment to listen, then run the client against it.
  auto command = fmt::format(
      "sh -c '{env} ucx_perftest -p {port} -E {mode} >/dev/null 2>&1 & server=$!; sleep 0.5; "
      "{env} ucx_perftest 127.0.0.1 -p {port} -t {test} -s {bytes} -n {n} -w {w} -O {w} -E {mode}; "
      "kill $server 2>/dev/null; wait $server 2>/dev/null'",
      fmt::arg("env", env), fmt::arg("port", o.port), fmt::arg("test", o.test), fmt::arg("bytes", o.bytes),
      fmt::arg("n", o.iterations), fmt::arg("w", o.window), fmt::arg("mode", o.wait_mode));
  auto output = run_command(command, 60);
  if (!o.written_buffers_shim.empty() && output.find(perftest_shim_mark) == std::string::npos)
    return std::nullopt;
  auto numbers = perftest_final(output);
  // Final: iterations, overhead p50/avg/overall (µs), bandwidth avg/overall
  // (MB/s of 2^20), message rate avg/overall.
  if (numbers.size() < 6)
    return std::nullopt;
  if (o.test == "ucp_am_lat")
    return 2 * numbers[1];
  return numbers[5] * double(1 << 20) / 1e9;
}

/// PyTorch RPC figures from bench/peers/rpc_latency.py --quick: keyed
/// "rtt/<transport>" (µs) and "send/<transport>/<bytes>" (GB/s).
inline std::map<std::string, double> pytorch_rpc(const std::string& script, const std::string& transports) {
  std::map<std::string, double> figures;
  auto output = run_command(fmt::format("/usr/bin/python3 {} --quick --transports {}", script, transports), 240);
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{')
      continue;
    auto median = json_number(line, "median");
    auto transport_at = line.find("\"transport\": \"");
    if (!median || transport_at == std::string::npos)
      continue;
    auto start = transport_at + 14;
    auto transport = line.substr(start, line.find('"', start) - start);
    if (line.find("\"rpc_sync_rtt_noarg\"") != std::string::npos)
      figures["rtt/" + transport] = *median;
    if (line.find("\"rpc_sync_send_tensor\"") != std::string::npos) {
      auto bytes = json_number(line, "payload_bytes");
      if (bytes)
        figures[fmt::format("send/{}/{}", transport, static_cast<long long>(*bytes))] = *median;
    }
  }
  return figures;
}

} // namespace troupe::bench
