// Data-parallel training throughput: the MLP of docs/baselines.md
// (8 x (Linear(1024, 1024) + ReLU), MSE, SGD(lr = 0.05), batch 256 per
// replica, one compute thread per process) on 1, 2 and 4 replica processes
// with troupe's data_parallel (gradient buckets reduced by the ring of
// reducer actors while backward runs), beside PyTorch DDP over Gloo
// (bench/peers/ddp_torch.py) in the same run. Per configuration: samples/s
// (replicas x 256 / median step time on rank 0), the median share of the
// reduction's time that ran before backward ended ("hidden"), how long the
// step then still waited for it ("exposed"), and #wrong = replicas whose
// parameters are not bitwise equal to rank 0's at the end.
//
//   build/bench/data_parallel [--json] [--model=mlp|gpt] [--steps=6] [--replicas=1,2,4] [--bucket-mib=25]
//                             [--min-buckets=4] [--no-peers]
//
// --model=gpt trains bench/gpt_step's `gpt` instead (bench/models.hpp: 6
// blocks of width 256, sequence 128, AdamW, cross entropy), batch 16 per
// replica (so the global batch grows with the replicas, as the MLP's),
// beside DDP of gpt_step_torch.py's model; its default replicas are 1,2.
//
// Both sides get --bucket-mib as their cap. troupe's default also splits a
// model smaller than min_buckets caps into about min_buckets buckets
// (gradient_bucket.hpp); DDP has no such rule, --min-buckets=1 turns it off
// for a plan like DDP's.
//
// This process is rank 0 and re-executes itself as the other replicas
// (--child=replica); gradient chunks travel over the UCX data plane. With
// TROUPE_TRACE_DIR set every replica writes a trace: its "backward" and
// "allreduce" spans are the intervals these figures come from.
#include <algorithm>
#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "baselines.hpp"
#include "models.hpp"
#include "rank_processes.hpp"
#include "report.hpp"
#include "troupe/parallel/data_parallel.hpp"

using namespace troupe;
using namespace troupe::parallel;

namespace {

constexpr int warmup = 2;

struct settings {
  std::string model = "mlp"; ///< bench/models.hpp's
  int steps = 6;
  double bucket_mib = 25;
  std::size_t min_buckets = bucket_options{}.min_buckets;
};

struct replica_result {
  std::vector<double> step_seconds;
  std::vector<double> hidden;   ///< per step, fraction
  std::vector<double> exposed_ms, backward_ms, reduce_ms;
  std::uint64_t digest = 0;     ///< FNV-1a of every parameter's bytes
  double first_loss = 0, last_loss = 0; ///< this replica's, on its own batch
  std::size_t buckets = 0;
};

std::vector<std::string> places_for(std::uint32_t n) {
  std::vector<std::string> names;
  for (std::uint32_t k = 0; k < n; ++k)
    names.push_back("worker" + std::to_string(k));
  return reducer_places(names);
}

std::uint64_t fnv1a(const nn::sequential& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : model.parameters()) {
    const auto* bytes = static_cast<const unsigned char*>(p.data().raw_data());
    for (std::size_t i = 0; i < p.data().nbytes(); ++i)
      h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

/// One replica's training loop (every rank runs it; rank 0 reports).
expected<replica_result> train(actors::node& node, std::uint32_t replicas, const settings& s) {
  auto group = reducer_group::join(node, {.rank = node.rank(), .places = places_for(replicas)});
  if (!group)
    return group.error();
  // Every replica its own shard: the data from a seed of its own.
  const auto work = bench::workload_named(s.model, 1234 + node.rank());
  auto model = work.recipe.model();
  data_parallel_options options;
  options.buckets.bucket_bytes = static_cast<std::size_t>(s.bucket_mib * (1 << 20));
  options.buckets.min_buckets = s.min_buckets;
  auto dp = data_parallel::create(model->named_parameters(), *group, options);
  if (!dp)
    return dp.error();
  auto optimizer = work.recipe.optimizer(model->named_parameters());
  autograd::variable x(work.x);
  replica_result out;
  out.buckets = dp->buckets().size();
  for (int step = 0; step < warmup + s.steps; ++step) {
    const auto start = bench::now_seconds();
    optimizer->zero_grad();
    auto loss = work.recipe.loss((*model)(x), work.y);
    if (auto ok = dp->backward(loss); !ok)
      return ok.error();
    optimizer->step();
    (step == 0 ? out.first_loss : out.last_loss) = loss.item();
    if (step < warmup)
      continue;
    out.step_seconds.push_back(bench::now_seconds() - start);
    auto st = dp->last_stats();
    out.hidden.push_back(st.hidden_fraction());
    out.exposed_ms.push_back(st.exposed_ms);
    out.backward_ms.push_back(st.backward_ms);
    out.reduce_ms.push_back(st.reduce_ms);
  }
  out.digest = fnv1a(*model);
  return out;
}

settings parse(int argc, char** argv) {
  settings s;
  s.model = bench::model_option(argc, argv);
  s.steps = static_cast<int>(bench::int_option(argc, argv, "steps", 6, 1, 1000));
  s.bucket_mib = bench::number_option(argc, argv, "bucket-mib", 25, 0.001, 4096);
  s.min_buckets = bench::list_option(argc, argv, "min-buckets", {s.min_buckets}).front();
  return s;
}

int child(int argc, char** argv) {
  return bench::run_child(argc, argv, [&](actors::node& node, std::uint32_t world_size) {
    auto result = train(node, world_size, parse(argc, argv));
    return result ? fmt::format("DONE {}", result->digest) : "FAILED " + result.error().message();
  });
}

/// PyTorch DDP's samples/s for `replicas` and rank 0's last loss, or nullopt.
struct ddp_figures {
  std::optional<double> samples_per_s;
  std::optional<double> loss;
};

ddp_figures torch_ddp(std::uint32_t replicas, const settings& s, bench::report& out) {
  auto script = std::string(TROUPE_SOURCE_DIR) + "/bench/peers/ddp_torch.py";
  auto output = bench::run_command(fmt::format("/usr/bin/python3 {} --model {} --replicas {} --steps {} --bucket-mib {}",
                                               script, s.model, replicas, s.steps, s.bucket_mib),
                                   300);
  bench::settle_after_peer();
  auto rate = bench::json_number(output, "samples_per_s");
  if (!rate)
    out.note("PyTorch DDP peer gave no figure for {} replicas (python3-torch missing?)", replicas);
  else if (output.find("\"identical\": true") == std::string::npos)
    out.note("PyTorch DDP's replicas ended with different parameters ({} replicas)", replicas);
  return {rate, bench::json_number(output, "loss")};
}

int parent(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  bench::check_flags("data_parallel", argc, argv, {"model=", "steps=", "bucket-mib=", "min-buckets=", "replicas=", "no-peers"});
  bench::report out("data_parallel", argc, argv);
  const auto s = parse(argc, argv);
  bool no_peers = false;
  for (int i = 1; i < argc; ++i)
    no_peers |= std::string_view(argv[i]) == "--no-peers";
  std::vector<std::uint32_t> counts;
  const auto work = bench::workload_named(s.model, 1234);
  const std::int64_t batch = work.batch;
  for (auto n : bench::list_option(argc, argv, "replicas", s.model == "gpt" ? std::vector<std::size_t>{1, 2}
                                                                              : std::vector<std::size_t>{1, 2, 4}))
    counts.push_back(static_cast<std::uint32_t>(n));
  bool any_wrong = false;
  std::vector<std::string> table;
  table.push_back(fmt::format("{:>8} {:>7} {:>10} {:>9} {:>11} {:>9} {:>8} {:>10} {:>7} {:>10} {:>6}", "replicas",
                              "buckets", "samples/s", "step ms", "backward ms", "reduce ms", "hidden", "exposed ms",
                              "#wrong", "torch DDP", "ratio"));
  for (auto n : counts) {
    auto node = bench::start_rank_zero(n);
    auto children = bench::start_ranks(*node, n, "replica",
                                       {"--model=" + s.model, fmt::format("--steps={}", s.steps), fmt::format("--bucket-mib={}", s.bucket_mib),
                                        fmt::format("--min-buckets={}", s.min_buckets)});
    auto mine = train(*node, n, s);
    if (!mine)
      throw std::runtime_error(fmt::format("{} replicas: {}", n, mine.error().message()));
    std::int64_t wrong = 0;
    for (const auto& line : bench::child_results(children, fmt::format("{} replicas", n), 300'000)) {
      std::istringstream in(line);
      std::string word;
      unsigned long long digest = 0;
      in >> word >> digest;
      wrong += digest != mine->digest;
    }
    bench::release_ranks(children, *node);

    const double step = bench::median(mine->step_seconds);
    const double rate = n * batch / step;
    const double hidden = bench::median(mine->hidden);
    const auto torch = no_peers ? ddp_figures{} : torch_ddp(n, s, out);
    const auto& peer = torch.samples_per_s;
    any_wrong |= wrong != 0;
    const auto wrong_text = wrong ? fmt::format("{} WRONG", wrong) : std::string("0");
    table.push_back(fmt::format("{:>8} {:>7} {:>10.1f} {:>9.1f} {:>11.1f} {:>9.1f} {:>7.0f}% {:>10.1f} {:>7} {:>10} {:>6}",
                                n, mine->buckets, rate, step * 1e3, bench::median(mine->backward_ms),
                                bench::median(mine->reduce_ms), hidden * 100, bench::median(mine->exposed_ms),
                                wrong_text, peer ? fmt::format("{:.1f}", *peer) : "-",
                                peer ? fmt::format("{:.2f}x", rate / *peer) : "-"));
    const auto name = fmt::format("troupe data_parallel, {} replicas", n);
    auto note = wrong ? wrong_text + " (replicas differ)" : std::string("replicas bitwise equal");
    if (s.model == "gpt") // rank 0's loss on its own batch: it must fall
      note += fmt::format("; loss {:.4f} -> {:.4f}{}{}", mine->first_loss, mine->last_loss,
                          mine->last_loss < mine->first_loss ? "" : " WRONG",
                          torch.loss ? fmt::format("; torch's last {:.4f}", *torch.loss) : "");
    out.add({name, "samples/s", rate, "samples/s", peer ? "torch DDP (gloo)" : "", peer, note});
    if (n > 1)
      out.add({name, "reduction hidden behind backward", hidden * 100, "%", "", std::nullopt,
               fmt::format("exposed {:.1f} ms per step", bench::median(mine->exposed_ms))});
  }
  if (!out.json()) {
    fmt::print("# data-parallel {}, batch {} per replica, {} timed steps, buckets of {} MiB (troupe: at least "
               "{} buckets while they fit; DDP: its own rule)\n",
               work.name, batch, s.steps, s.bucket_mib, s.min_buckets);
    for (const auto& l : table)
      fmt::print("{}\n", l);
  }
  out.print();
  return any_wrong ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  return bench::child_or_parent(argc, argv, "data_parallel", "replica", child, parent);
}
