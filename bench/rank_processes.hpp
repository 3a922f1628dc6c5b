#pragma once
// The processes of a multi-process benchmark: rank 0 is the benchmark
// itself, the others are the same executable started with `--child=<role>`
// and the node flags of one local job (bench/data_parallel, bench/tensor_parallel).
// A child prints one line ("DONE ..." or "FAILED ...") and stays until rank 0
// writes 'q' on its stdin, so that rank 0's last collective still finds it.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "peer_process.hpp"
#include "troupe/actors/node.hpp"

namespace troupe::bench {

/// Rank 0's node of an `n`-rank job on 127.0.0.1 (throws when it cannot
/// start); `request_timeout` bounds its requests (a remote spawn that builds
/// a large model takes longer than the default).
inline std::unique_ptr<actors::node> start_rank_zero(std::uint32_t n, std::chrono::milliseconds request_timeout =
                                                                         actors::node_options{}.request_timeout) {
  actors::node_options options;
  options.request_timeout = request_timeout;
  options.name = "worker0";
  options.world_size = n;
  options.listen_address = "127.0.0.1";
  auto started = actors::node::start(options);
  if (!started)
    throw std::runtime_error(started.error().message());
  return std::move(*started);
}

/// Ranks 1..n-1: this executable with `--child=<role>`, the node flags and `args`.
inline std::vector<std::unique_ptr<peer_process>> start_ranks(const actors::node& rank_zero, std::uint32_t n,
                                                              std::string_view role,
                                                              const std::vector<std::string>& args) {
  std::vector<std::unique_ptr<peer_process>> children;
  for (std::uint32_t k = 1; k < n; ++k) {
    std::vector<std::string> argv{std::filesystem::read_symlink("/proc/self/exe").string(),
                                  fmt::format("--child={}", role),
                                  fmt::format("--troupe.coordinator=127.0.0.1:{}", rank_zero.port()),
                                  fmt::format("--troupe.rank={}", k), fmt::format("--troupe.world-size={}", n),
                                  fmt::format("--troupe.name=worker{}", k), "--troupe.listen-address=127.0.0.1"};
    argv.insert(argv.end(), args.begin(), args.end());
    children.push_back(std::make_unique<peer_process>(argv));
  }
  return children;
}

/// Each child's line; throws naming the first that did not answer "DONE ...".
inline std::vector<std::string> child_results(std::vector<std::unique_ptr<peer_process>>& children,
                                              std::string_view what, int timeout_ms) {
  std::vector<std::string> lines;
  for (auto& c : children) {
    auto line = c->read_line(timeout_ms).value_or("FAILED no answer");
    if (!line.starts_with("DONE"))
      throw std::runtime_error(fmt::format("{}: a rank failed: {}", what, line));
    lines.push_back(line);
  }
  return lines;
}

/// Releases the children ('q') and stops rank 0's node.
inline void release_ranks(std::vector<std::unique_ptr<peer_process>>& children, actors::node& rank_zero) {
  for (auto& c : children)
    c->ask("q", 0);
  children.clear();
  rank_zero.stop();
}

/// A child's whole life: starts its node from the command line, prints
/// `work(node, world_size)`'s line, waits for rank 0's 'q', stops.
template <class Work> int run_child(int argc, char** argv, Work&& work) {
  auto options = actors::node_options::from(argc, argv);
  if (!options)
    return 2;
  auto started = actors::node::start(*options);
  if (!started) {
    std::printf("ERROR %s\n", started.error().message().c_str());
    return 3;
  }
  {
    const std::string line = work(**started, options->world_size);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    char c;
    while (read(0, &c, 1) == 1 && c != 'q') {
    }
  }
  (*started)->stop();
  return 0;
}

/// A benchmark's main(): `child` when started as `--child=<role>`, else
/// `parent`, whose exceptions end the program with 1 and their message.
template <class Child, class Parent>
int child_or_parent(int argc, char** argv, std::string_view name, std::string_view role, Child&& child,
                    Parent&& parent) {
  const auto flag = fmt::format("--child={}", role);
  for (int i = 1; i < argc; ++i)
    if (argv[i] == flag)
      return child(argc, argv);
  try {
    return parent(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", name, e.what());
    return 1;
  }
}

} // namespace troupe::bench
