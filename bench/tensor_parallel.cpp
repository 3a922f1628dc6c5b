// Tensor parallelism: forward + backward of a GPT transformer block
// (layer norm, causal self-attention, layer norm, MLP of 4 x width, GELU;
// float32, one compute thread per process) with its heads and hidden
// features split over `degree` processes (parallel_transformer_block: two
// allreduces forward, two backward), beside one process, and beside a
// Megatron-style PyTorch 1.13 peer (bench/peers/tensor_parallel_torch.py:
// the same block written with torch.distributed.all_reduce over Gloo) in
// the same run. Per degree: median step ms on rank 0, speed-up over degree
// 1, the bytes the four allreduces move per step by the ring's formula
// (2 (k-1)/k of the [batch, seq, width] activation per allreduce and rank),
// and whether the loss equals degree 1's (float32: 1e-4 relative).
//
//   build/bench/tensor_parallel [--json] [--steps=5] [--width=2048] [--heads=16] [--seq=256] [--batch=8]
//                               [--degrees=1,2] [--no-peers]
//
// This process is rank 0 and re-executes itself as the other ranks
// (--child=rank); on one host the allreduces take the reducer group's
// shared-memory path.
#include <algorithm>
#include <csignal>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "baselines.hpp"
#include "rank_processes.hpp"
#include "report.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/parallel/tensor_parallel_transformer.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;
using namespace troupe::parallel;

namespace {

constexpr int warmup = 1;

struct settings {
  int steps = 5;
  std::int64_t width = 2048, heads = 16, seq = 256, batch = 8;
};

settings parse(int argc, char** argv) {
  settings s;
  s.steps = static_cast<int>(bench::int_option(argc, argv, "steps", 5, 1, 1000));
  s.width = bench::int_option(argc, argv, "width", 2048, 8, 16384);
  s.heads = bench::int_option(argc, argv, "heads", 16, 1, 1024);
  s.seq = bench::int_option(argc, argv, "seq", 256, 1, 1 << 16);
  s.batch = bench::int_option(argc, argv, "batch", 8, 1, 1 << 16);
  if (s.width % s.heads != 0) {
    command_line flags(argc, argv);
    flags.reject(fmt::format("--heads is {} but must divide --width={}", s.heads, s.width));
    bench::exit_on_bad_value(flags);
  }
  return s;
}

struct rank_result {
  std::vector<double> step_seconds;
  double loss = 0;
};

std::vector<std::string> places_for(std::uint32_t n) {
  std::vector<std::string> names;
  for (std::uint32_t k = 0; k < n; ++k)
    names.push_back("worker" + std::to_string(k));
  return reducer_places(names);
}

/// `steps` timed forward + backward passes (after a warm-up) of the split
/// block on this rank; the loss is the mean square of the output.
expected<rank_result> run_rank(actors::node& node, std::uint32_t degree, const settings& s) {
  auto group = reducer_group::join(node, {.rank = node.rank(), .places = places_for(degree), .timeout = std::chrono::milliseconds{120'000}});
  if (!group)
    return group.error();
  parallel_transformer_block block({.n_embd = s.width, .n_head = s.heads, .type = dtype::float32, .seed = 7}, *group);
  generator gen{11};
  const auto x = randn({s.batch, s.seq, s.width}, gen, 0.0, 1.0, dtype::float32); // the same on every rank
  rank_result out;
  for (int step = 0; step < warmup + s.steps; ++step) {
    block.zero_grad();
    const double start = bench::now_seconds();
    auto y = block(autograd::variable(x));
    auto loss = autograd::mean(autograd::mul(y, y));
    autograd::backward(loss);
    if (step >= warmup)
      out.step_seconds.push_back(bench::now_seconds() - start);
    out.loss = loss.item();
  }
  return out;
}

int child(int argc, char** argv) {
  return bench::run_child(argc, argv, [&](actors::node& node, std::uint32_t world_size) {
    auto result = run_rank(node, world_size, parse(argc, argv));
    return result ? fmt::format("DONE {:.9g}", result->loss) : "FAILED " + result.error().message();
  });
}

/// The PyTorch peer's median step seconds at `degree`, or nullopt.
std::optional<double> torch_peer(std::uint32_t degree, const settings& s, bench::report& out) {
  auto script = std::string(TROUPE_SOURCE_DIR) + "/bench/peers/tensor_parallel_torch.py";
  auto output = bench::run_command(fmt::format("/usr/bin/python3 {} --degree {} --steps {} --width {} --heads {} "
                                               "--seq {} --batch {}",
                                               script, degree, s.steps, s.width, s.heads, s.seq, s.batch),
                                   600);
  bench::settle_after_peer();
  auto step = bench::json_number(output, "median_step_seconds");
  if (!step)
    out.note("PyTorch tensor-parallel peer gave no figure at degree {} (python3-torch missing?)", degree);
  return step;
}

int parent(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  bench::check_flags("tensor_parallel", argc, argv,
                     {"steps=", "width=", "heads=", "seq=", "batch=", "degrees=", "no-peers"});
  bench::report out("tensor_parallel", argc, argv);
  const auto s = parse(argc, argv);
  bool no_peers = false;
  for (int i = 1; i < argc; ++i)
    no_peers |= std::string_view(argv[i]) == "--no-peers";
  std::vector<std::uint32_t> degrees;
  for (auto n : bench::list_option(argc, argv, "degrees", {1, 2}))
    degrees.push_back(static_cast<std::uint32_t>(n));
  std::optional<double> one_process, one_process_loss;
  bool any_wrong = false;
  std::vector<std::string> table;
  table.push_back(fmt::format("{:>6} {:>9} {:>9} {:>14} {:>12} {:>12} {:>6}", "degree", "step ms", "speed-up",
                              "MiB/step/rank", "loss", "torch ms", "ratio"));
  for (auto n : degrees) {
    auto node = bench::start_rank_zero(n);
    auto children = bench::start_ranks(*node, n, "rank",
                                       {fmt::format("--steps={}", s.steps), fmt::format("--width={}", s.width),
                                        fmt::format("--heads={}", s.heads), fmt::format("--seq={}", s.seq),
                                        fmt::format("--batch={}", s.batch)});
    auto mine = run_rank(*node, n, s);
    if (!mine)
      throw std::runtime_error(fmt::format("degree {}: {}", n, mine.error().message()));
    bench::child_results(children, fmt::format("degree {}", n), 600'000);
    bench::release_ranks(children, *node);

    const double step = bench::median(mine->step_seconds);
    if (n == 1) {
      one_process = step;
      one_process_loss = mine->loss;
    }
    const bool wrong = one_process_loss && std::abs(mine->loss - *one_process_loss) >
                                               1e-4 * std::max(1.0, std::abs(*one_process_loss));
    any_wrong |= wrong;
    // Four allreduces of the [batch, seq, width] activation, each moving 2 (k-1)/k of it per rank.
    const double activation = static_cast<double>(s.batch * s.seq * s.width * 4);
    const double mib = n > 1 ? 4.0 * 2.0 * (n - 1) / n * activation / (1 << 20) : 0.0;
    std::optional<double> peer;
    if (!no_peers)
      peer = torch_peer(n, s, out);
    const double peer_s = peer.value_or(0.0);
    table.push_back(fmt::format("{:>6} {:>9.1f} {:>9} {:>14.1f} {:>12.6g}{} {:>12} {:>6}", n, step * 1e3,
                                one_process ? fmt::format("{:.2f}x", *one_process / step) : "-", mib, mine->loss,
                                wrong ? " WRONG" : "", peer ? fmt::format("{:.1f}", peer_s * 1e3) : "-",
                                peer ? fmt::format("{:.2f}x", peer_s / step) : "-"));
    const auto name = fmt::format("troupe tensor-parallel block, degree {}", n);
    std::optional<double> peer_rate;
    if (peer)
      peer_rate = 1.0 / peer_s;
    out.add({name, "steps/s", 1.0 / step, "steps/s", peer ? "torch all_reduce (gloo)" : "", peer_rate,
             fmt::format("{:.2f}x one process; {}", one_process ? *one_process / step : 1.0,
                         wrong ? "loss differs from degree 1: WRONG" : "loss equals degree 1's")});
  }
  if (!out.json()) {
    fmt::print("# transformer block, width {}, {} heads, MLP {}, sequence {}, batch {}, float32, forward + backward, "
               "{} timed steps, one thread per process\n",
               s.width, s.heads, 4 * s.width, s.seq, s.batch, s.steps);
    for (const auto& l : table)
      fmt::print("{}\n", l);
  }
  out.print();
  return any_wrong ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  return bench::child_or_parent(argc, argv, "tensor_parallel", "rank", child, parent);
}
