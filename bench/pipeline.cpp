// Pipeline-parallel training throughput: the MLP of docs/baselines.md
// (8 x (Linear(1024, 1024) + ReLU), batch 256, MSE, SGD lr 0.05, one compute
// thread per stage) split 4 + 4 over two stage actors, micro-batches 1, 2, 4
// and 8 with GPipe and 1F1B, and three unequal ones (48, 104 and 104 rows:
// a small first micro-batch fills the pipeline sooner), beside troupe in
// one process without a
// pipeline and PyTorch's RPC pipeline (bench/peers/rpc_pipeline.py) in
// the same run (PyTorch before and after troupe, its better figure kept).
// Bubble fraction per configuration: measured (1 − the busier
// stage's compute time / step time, from the stages' own counters) next to
// GPipe's (p−1)/(m+p−1).
//
//   build/bench/pipeline [--json] [--model=mlp|gpt|gpt_wide] [--device=cpu|cuda:0] [--steps=3] [--no-peers] [--processes=2] [--chunks=1,2]
//                        [--micro-batches=1,2,4,8] [--unequal-rows=48,104,104]
//                        [--immediate-weight-gradients] [--no-idle-fill]
//
// Stages compute weight gradients once per step (deferred, the default of
// pipeline_options) unless --immediate-weight-gradients, and compute kept
// ones while they wait ("idle filled": that time as a share of the step,
// summed over stages) unless --no-idle-fill; --chunks=2 places
// two model chunks on every process (stages on worker0, worker1, worker0,
// worker1), a form of interleaving by placement.
//
// "updates overlapped" rows set pipeline_options::overlap_update: each
// stage's remaining weight gradients and optimizer step run while the next
// step's first micro-batch goes through the stages before it. Those rows
// are timed as one run of `steps` steps ending in synchronize() (the mean,
// not a median), and their busy times and bubble come from the stages'
// totals over that run.
//
// The stages are detached actors (one thread each) in this process: the
// same stage code runs across processes through the tensor router
// (parallel/remote.hpp); on two cores, two threads or two processes use the
// same two cores. With --processes=2 the bench also re-executes itself as a
// second node (worker1, on 127.0.0.1) and adds the same configurations with
// stage 0 here and stage 1 there ("2 processes" rows).
//
// --model=gpt trains bench/gpt_step's `gpt` instead (bench/models.hpp: 6
// blocks of width 256, 8 heads, sequence 128, batch 16, vocabulary 86,
// AdamW lr 3e-3 and weight decay 0.01, cross entropy from the logits), its
// 8 layers split 4 + 4 (embedding and 3 blocks, 3 blocks and the head),
// beside the same split of gpt_step_torch.py's model over PyTorch's RPC
// pipeline. Its rows are the equal micro-batch splits only (unequal ones
// with --unequal-rows, which must then add up to 16; no overlapped rows),
// so that a run at the default --steps stays within about 3 minutes.
//
// --model=gpt_wide trains gpt_step's 473M-parameter GPT (width 2560; meant
// for --device=cuda:0, where the `gpt` is launch-bound), with no peer.
//
// --device=cuda:0 puts every stage (and the one-process baseline) on the
// GPU: the stages of one process share it and pass activations by
// reference; with --processes=2 both processes use it and activations cross
// through the host. No peer runs on a GPU (PyTorch 2's Pipe is gone), and
// the stages' busy times, hence the bubble column, count the host's kernel
// launches, not the kernels.
#include <filesystem>
#include <iostream>
#include <numeric>
#include <thread>

#include <optional>

#include "baselines.hpp"
#include "models.hpp"
#include "peer_process.hpp"
#include "report.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/tensor/cuda.hpp"

using namespace troupe;

namespace {

/// The data's seed: the MLP's x and y as they always were.
constexpr std::uint64_t data_seed = 1234;

/// --processes=2: the second node (worker1), hosting stage 1 until its stdin
/// says quit or closes.
int run_stage_process(int argc, char** argv) {
  auto options = actors::node_options::from(argc, argv);
  if (!options) {
    std::printf("ERROR %s\n", options.error().message().c_str());
    return 2;
  }
  auto started = actors::node::start(*options);
  if (!started) {
    std::printf("ERROR %s\n", started.error().message().c_str());
    return 1;
  }
  parallel::register_stage_factory(**started, bench::workload_named(bench::model_option(argc, argv, true), data_seed).recipe);
  std::printf("READY\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
  }
  (*started)->stop();
  return 0;
}

/// Best (highest) samples/s of PyTorch's RPC pipeline, and its one-process
/// figure, from the peer script's JSON lines.
struct torch_figures {
  std::optional<double> local;
  std::optional<double> best_rpc;
  std::string best_rpc_case;
};

torch_figures pytorch_pipeline(const std::string& model, const std::vector<std::size_t>& micro_batches, int steps) {
  torch_figures figures;
  auto script = std::string(TROUPE_SOURCE_DIR) + "/bench/peers/rpc_pipeline.py";
  if (!std::filesystem::exists(script))
    return figures;
  auto output = bench::run_command(
      fmt::format("/usr/bin/python3 {} --model {} --modes local,rpc --micro-batches {} --steps {} --rpc-transports uv",
                  script, model, fmt::join(micro_batches, ","), steps),
      300);
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{' || line.find("\"train_samples_per_s\"") == std::string::npos)
      continue;
    auto median = bench::json_number(line, "median");
    auto mb = bench::json_number(line, "micro_batches");
    if (!median)
      continue;
    if (line.find("\"mode\": \"local_single_process\"") != std::string::npos) {
      figures.local = *median;
    } else if (line.find("\"mode\": \"rpc_pipeline\"") != std::string::npos &&
               (!figures.best_rpc || *median > *figures.best_rpc)) {
      figures.best_rpc = *median;
      figures.best_rpc_case = fmt::format("RPC pipeline m={}", mb ? static_cast<int>(*mb) : 0);
    }
  }
  return figures;
}

/// Each figure the higher of `a`'s and `b`'s.
torch_figures better(const torch_figures& a, const torch_figures& b) {
  torch_figures out = a;
  if (b.local && (!out.local || *b.local > *out.local))
    out.local = b.local;
  if (b.best_rpc && (!out.best_rpc || *b.best_rpc > *out.best_rpc)) {
    out.best_rpc = b.best_rpc;
    out.best_rpc_case = b.best_rpc_case;
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "--stage-process")
    return run_stage_process(argc - 1, argv + 1);
  bench::check_flags("pipeline", argc, argv,
                     {"model=", "device=", "steps=", "processes=", "chunks=", "micro-batches=", "unequal-rows=", "no-peers", "immediate-weight-gradients", "no-idle-fill"});
  bench::report out("pipeline", argc, argv);
  const auto model_name = bench::model_option(argc, argv, /*with_wide=*/true);
  const bool gpt = model_name != "mlp";
  const int steps = static_cast<int>(bench::int_option(argc, argv, "steps", 3, 1, 1000));
  const int processes = static_cast<int>(bench::int_option(argc, argv, "processes", 1, 1, 2));
  bool peers = true;
  bool defer_weight_gradients = true;
  bool fill_idle = true;
  for (int i = 1; i < argc; ++i) {
    fill_idle &= std::string_view(argv[i]) != "--no-idle-fill";
    peers &= std::string_view(argv[i]) != "--no-peers";
    defer_weight_gradients &= std::string_view(argv[i]) != "--immediate-weight-gradients";
  }

  const auto device_name = bench::option(argc, argv, "device", "cpu");
  if (device_name != "cpu" && device_name != "cuda:0") {
    std::fprintf(stderr, "pipeline: --device: '%s' is not cpu or cuda:0\n", device_name.c_str());
    return 2;
  }
  const auto where = device_name == "cpu" ? device::cpu() : device::cuda(0);
  if (where != device::cpu() && cuda_device_count() == 0) {
    out.note("no CUDA device ({}): nothing measured", cuda_unavailable_reason());
    out.print();
    return 0;
  }
  if (where != device::cpu() || model_name == "gpt_wide")
    peers = false;

  const auto work = bench::workload_named(model_name, data_seed);
  const auto& recipe = work.recipe;
  const std::int64_t batch = work.batch;
  // The driver's batch lives where the first stage does (the stage would move it otherwise).
  const tensor x = work.x.to(where);
  const tensor y = work.y.to(where);

  // troupe in one process, no pipeline.
  auto local_model = recipe.model();
  local_model->to(where);
  auto local_optimizer = recipe.optimizer(local_model->named_parameters());
  auto local_step = [&] {
    local_optimizer->zero_grad();
    auto loss = recipe.loss((*local_model)(autograd::variable(x)), y);
    autograd::backward(loss);
    local_optimizer->step();
    return loss.item();
  };

  // In-process pipelines run on a local job (no socket).
  auto local = troupe::job::local();
  if (!local) {
    fmt::print(stderr, "pipeline: {}\n", local.error().message());
    return 1;
  }

  // --processes=2: this process is worker0 (coordinator, stage 0), the
  // child worker1 (stage 1); both build the model from the same seed.
  std::unique_ptr<actors::node> node;
  std::unique_ptr<bench::peer_process> stage_process;
  if (processes == 2) {
    actors::node_options node_options;
    node_options.name = "worker0";
    node_options.world_size = 2;
    node_options.listen_address = "127.0.0.1";
    auto started = actors::node::start(node_options);
    if (!started) {
      fmt::print(stderr, "pipeline: {}\n", started.error().message());
      return 1;
    }
    node = std::move(*started);
    parallel::register_stage_factory(*node, recipe);
    stage_process = std::make_unique<bench::peer_process>(std::vector<std::string>{
        std::filesystem::read_symlink("/proc/self/exe").string(), "--stage-process",
        "--troupe.coordinator=127.0.0.1:" + std::to_string(node->port()), "--troupe.rank=1",
        "--troupe.world-size=2", "--troupe.listen-address=127.0.0.1", "--troupe.name=worker1",
        "--model=" + model_name});
    auto ready = stage_process->started() ? stage_process->read_line(30000) : std::nullopt;
    if (!ready || *ready != "READY" || !node->wait_for_nodes(2, std::chrono::seconds(10))) {
      fmt::print(stderr, "pipeline: the stage process did not start: {}\n", ready.value_or("no answer"));
      return 1;
    }
  }

  struct configuration {
    std::string prefix;
    std::string name;
    parallel::schedule_kind schedule;
    std::size_t micro_batches;
    std::vector<double> shares; // unequal micro-batches' rows; empty: equal
    bool remote;
    std::size_t chunks; // model chunks per process (interleaved: > 1)
    bool overlap;       // pipeline_options::overlap_update
    std::optional<parallel::pipeline> pipe;
    std::vector<double> seconds;
    std::vector<double> bubbles;
    std::vector<double> fill_shares; // of the step, summed over stages
    std::vector<std::vector<double>> busy_ms; // per stage, per timed step
    std::vector<double> local_seconds; // one-process steps right before and after
    double first_loss = 0, last_loss = 0;
  };
  auto make_pipe = [&](const configuration& c) {
    parallel::pipeline_options options;
    if (c.remote) {
      options = parallel::pipeline_options_from(recipe);
    } else {
      options.in_this_process = true;
      options.model = recipe.model();
      options.optimizer = recipe.optimizer;
      options.loss = recipe.loss;
    }
    for (std::size_t k = 0; k < c.chunks; ++k)
      for (const char* node : {"worker0", c.remote ? "worker1" : "worker0"})
        options.places.push_back(fmt::format("{}/{}", node, device_name));
    options.split = parallel::even(options.places.size(), options.model->size());
    options.schedule = c.schedule;
    options.micro_batches = c.micro_batches;
    options.micro_batch_shares = c.shares;
    options.defer_weight_gradients = defer_weight_gradients;
    options.fill_idle_with_weight_gradients = fill_idle;
    options.overlap_update = c.overlap;
    return parallel::pipeline::create(c.remote ? *node : local->node(), std::move(options));
  };
  // A configuration's run failed: says why, and is false.
  auto failed = [](const configuration& c, const troupe::error& why) {
    fmt::print(stderr, "pipeline {}, {}: {}\n", c.prefix, c.name, why.message());
    return false;
  };
  // One step of `c`: untimed (the warm-up) or timed, with the bubble from
  // the stages' counters. False (and a message) when the step fails.
  auto step = [&](configuration& c, bool timed) {
    auto start = bench::now_seconds();
    auto loss = c.pipe->train_step(x, y);
    auto elapsed = bench::now_seconds() - start;
    if (!loss)
      return failed(c, loss.error());
    if (!timed)
      c.first_loss = *loss;
    c.last_loss = *loss;
    if (!timed)
      return true;
    c.seconds.push_back(elapsed);
    if (auto stats = c.pipe->stats()) {
      double busiest = 0, fill = 0;
      c.busy_ms.resize(stats->size());
      for (std::size_t k = 0; k < stats->size(); ++k)
        c.busy_ms[k].push_back((*stats)[k].busy_ms);
      for (const auto& s : *stats) {
        busiest = std::max(busiest, s.busy_ms / 1e3);
        fill += s.fill_ms / 1e3;
      }
      c.bubbles.push_back(1.0 - busiest / elapsed);
      c.fill_shares.push_back(fill / elapsed);
    }
    return true;
  };
  // With overlapped updates a step's end runs inside the next step, so
  // steps are timed as one run: `steps` consecutive train_steps and the
  // synchronize() that waits for the last one's updates, their busy and
  // fill times from the stages' totals before and after. The step time is
  // the run's mean (the baseline's is a median: no help to this side).
  auto overlapped_run = [&](configuration& c) {
    auto before = c.pipe->stats(); // also waits for the warm-up's updates
    if (!before)
      return failed(c, before.error());
    auto start = bench::now_seconds();
    for (int round = 0; round < steps; ++round) {
      auto loss = c.pipe->train_step(x, y);
      if (!loss)
        return failed(c, loss.error());
      c.last_loss = *loss;
    }
    auto synced = c.pipe->synchronize();
    auto elapsed = bench::now_seconds() - start;
    auto after = c.pipe->stats();
    if (!synced)
      return failed(c, synced.error());
    if (!after)
      return failed(c, after.error());
    c.seconds.push_back(elapsed / steps);
    double busiest = 0, fill = 0;
    c.busy_ms.resize(after->size());
    for (std::size_t k = 0; k < after->size(); ++k) {
      const double busy = (*after)[k].total_busy_ms - (*before)[k].total_busy_ms;
      c.busy_ms[k].push_back(busy / steps);
      busiest = std::max(busiest, busy / 1e3);
      fill += ((*after)[k].total_fill_ms - (*before)[k].total_fill_ms) / 1e3;
    }
    c.bubbles.push_back(1.0 - busiest / elapsed);
    c.fill_shares.push_back(fill / elapsed);
    return true;
  };
  std::vector<configuration> configurations;
  const auto chunk_counts = bench::list_option(argc, argv, "chunks", {1});
  const auto micro_batch_counts = bench::list_option(argc, argv, "micro-batches", {1, 2, 4, 8});
  // Equal micro-batches (no shares), then one split with a small first
  // micro-batch: (count, shares).
  std::vector<std::pair<std::size_t, std::vector<double>>> splits;
  for (auto m : micro_batch_counts)
    splits.emplace_back(m, std::vector<double>{});
  std::vector<double> unequal;
  for (auto rows : bench::list_option(argc, argv, "unequal-rows", gpt ? std::vector<std::size_t>{}
                                                                         : std::vector<std::size_t>{48, 104, 104}))
    unequal.push_back(static_cast<double>(rows));
  if (!unequal.empty() && std::accumulate(unequal.begin(), unequal.end(), 0.0) != double(batch)) {
    fmt::print(stderr, "pipeline: --unequal-rows must add up to the batch, {}\n", batch);
    return 2;
  }
  if (!unequal.empty())
    splits.emplace_back(unequal.size(), unequal);
  for (bool remote : {false, true}) {
    if (remote && !node)
      break;
    for (auto chunks : chunk_counts)
      for (auto schedule : {parallel::schedule_kind::gpipe, parallel::schedule_kind::one_f_one_b})
        for (const auto& [m, shares] : splits) {
          auto name = fmt::format("{} m={}", schedule == parallel::schedule_kind::gpipe ? "GPipe" : "1F1B", m);
          if (!shares.empty())
            name += fmt::format(" ({} rows)", fmt::join(shares, "/"));
          if (chunks > 1)
            name += fmt::format(" x{} chunks", chunks);
          configurations.push_back({remote ? "2 processes" : "pipeline 2 stages", name, schedule, m, shares,
                                    remote, std::size_t(chunks), false, std::nullopt, {}, {}, {}, {}, {}, 0, 0});
        }
    // Updates overlapping the next step: the unequal split and m = 2, 4
    // (the MLP's rows only).
    if (gpt)
      continue;
    for (auto schedule : {parallel::schedule_kind::gpipe, parallel::schedule_kind::one_f_one_b})
      for (const auto& [m, shares] : splits) {
        if (shares.empty() && m != 2 && m != 4)
          continue;
        auto name = fmt::format("{} m={}", schedule == parallel::schedule_kind::gpipe ? "GPipe" : "1F1B", m);
        if (!shares.empty())
          name += fmt::format(" ({} rows)", fmt::join(shares, "/"));
        name += ", updates overlapped";
        configurations.push_back({remote ? "2 processes" : "pipeline 2 stages", name, schedule, m, shares, remote,
                                  1, true, std::nullopt, {}, {}, {}, {}, {}, 0, 0});
      }
  }

  // The one-process baseline runs as PyTorch's does: consecutive steps
  // after a warm-up (its weights stay in cache), in a block before the
  // pipelines and one after each configuration; each configuration's ratio
  // is to the blocks right before and after it, so that the machine's
  // drift (2x within minutes) hits both sides alike. Its loss after
  // the first block (warm-up + `steps`) is the reference every
  // configuration, trained from the same seed for as many steps, must match.
  // PyTorch runs before and after troupe; each of its figures is the better
  // of the two runs, so the machine's drift never favours troupe.
  torch_figures torch_before;
  if (peers) {
    torch_before = pytorch_pipeline(model_name, micro_batch_counts, steps);
    bench::settle_after_peer();
  }
  std::vector<double> local_seconds;
  double local_first = local_step(), local_last = local_first;
  auto local_block = [&](bool reference) {
    std::vector<double> block;
    for (int round = 0; round < steps; ++round) {
      auto start = bench::now_seconds();
      auto loss = local_step();
      block.push_back(bench::now_seconds() - start);
      if (reference)
        local_last = loss;
    }
    local_seconds.insert(local_seconds.end(), block.begin(), block.end());
    return block;
  };
  auto block_before = local_block(true);
  // Each configuration alone, its steps consecutive: a warm-up, then `steps`
  // timed. Across processes this is also required: stage names are per node
  // ("worker1/cpu/stage1"), so two pipelines over the same nodes cannot live
  // at once.
  for (auto& c : configurations) {
    auto pipe = make_pipe(c);
    if (!pipe) {
      fmt::print(stderr, "pipeline: {}, {}: {}\n", c.prefix, c.name, pipe.error().message());
      return 1;
    }
    c.pipe = std::move(*pipe);
    if (c.overlap) {
      if (!step(c, false) || !overlapped_run(c))
        return 1;
    } else {
      for (int round = 0; round <= steps; ++round)
        if (!step(c, round > 0))
          return 1;
    }
    c.pipe.reset();
    auto block_after = local_block(false);
    c.local_seconds = block_before;
    c.local_seconds.insert(c.local_seconds.end(), block_after.begin(), block_after.end());
    block_before = std::move(block_after);
  }

  torch_figures torch;
  if (peers) {
    torch = better(torch_before, pytorch_pipeline(model_name, micro_batch_counts, steps));
    if (!torch.local && !torch.best_rpc)
      out.note("PyTorch peer unavailable (python3-torch and bench/peers/rpc_pipeline.py needed)");
  }
  if (gpt)
    out.note("{} ({} layers split {}), batch {}, AdamW; PyTorch: gpt_step_torch.py's model split alike over its RPC "
             "pipeline (TensorPipe uv), its best micro-batch count",
             work.name, local_model->size(), "4 + 4", batch);

  auto local_rate = batch / bench::median(local_seconds);
  out.add({"troupe, one process, no pipeline", "samples/s", local_rate, "samples/s",
           torch.local ? "PyTorch one process" : "", torch.local,
           fmt::format("loss {:.4f} -> {:.4f}", local_first, local_last)});
  for (auto& c : configurations) {
    auto rate = batch / bench::median(c.seconds);
    const double p = 2;
    // GPipe's fill takes p - 1 forwards of the first micro-batch and its
    // drain p - 1 backwards of the last: with costs in proportion to rows,
    // (p-1)(r_first + r_last) / (2B + (p-1)(r_first + r_last)), which is
    // (p-1)/(m+p-1) for equal parts.
    const auto rows = parallel::micro_batch_rows(batch, c.micro_batches, c.shares);
    const double ends = (p - 1) * double(rows.front() + rows.back());
    auto gpipe_bubble = ends / (2.0 * double(batch) + ends);
    // Correctness column: the pipelined loss equals the one-process loss
    // (same model, seed and data; float summation order aside).
    bool same = std::abs(c.last_loss - local_last) <= 1e-4 * std::abs(local_last);
    std::vector<long> busy;
    for (auto& per_stage : c.busy_ms)
      busy.push_back(std::lround(bench::median(per_stage)));
    auto note = fmt::format("bubble {:.2f} (GPipe theory {:.2f}); idle filled {:.2f}; stages busy {} ms; loss {:.5f}{}{}",
                            bench::median(c.bubbles), gpipe_bubble, bench::median(c.fill_shares),
                            fmt::join(busy, "/"), c.last_loss,
                            gpt ? fmt::format(" (one process {:.5f})", local_last) : "",
                            same ? "" : " WRONG (differs from one process)");
    out.add({c.prefix + ", " + c.name, "samples/s", rate, "samples/s", "one process, adjacent",
             batch / bench::median(c.local_seconds), note});
    if (torch.best_rpc)
      out.add({c.prefix + ", " + c.name, "samples/s", rate, "samples/s", "PyTorch " + torch.best_rpc_case,
               torch.best_rpc, ""});
  }
  out.print();
  configurations.clear(); // stop the stages before the actor system goes
  stage_process.reset();  // "quit": worker1 stops its node, then this one
  if (node)
    node->stop();
  return 0;
}
