// Parameter servers beside PyTorch RPC, in the same run:
//
//   build/bench/parameter_server [--rounds=3] [--epochs=100] [--rows=10000000] [--no-peers] [--quick] [--json]
//
// (a) The "Combining DDP with Distributed RPC" tutorial topology (master,
//     server with EmbeddingBag(100, 16, sum), 2 data-parallel trainers with
//     Linear(16, 8), SGD 0.05, the tutorial's random batches): troupe's
//     examples/parameter_server_demo over 4 processes against
//     bench/peers/ddp_rpc_hybrid.py's tutorial config, rounds alternated,
//     aggregate iterations/s of both trainers (each side times its loop
//     after 5 warm-up iterations).
// (b) The scaled sparse case: a 10M x 64 float32 table (--rows) hashed over
//     2 server processes, 2 trainers with a data-parallel Linear(64, 8),
//     512 bags of 20 ids from Zipf(1.1), SGD 0.05, synchronous and
//     asynchronous (PyTorch RPC orders nothing between trainers: its
//     semantics are troupe's asynchronous), against
//     bench/peers/ps_zipf_torch.py (PyTorch RPC, two RemoteModule halves
//     with sparse=True): iterations/s, ids looked up and rows updated per
//     second, the share of memcpy's rate that the rows moved, and each
//     server's resident memory.
// (c) The tutorial topology, synchronous against bounded staleness (2) and
//     asynchronous.
// (d) Ray's documented parameter-server pattern (bench/peers/ps_ray.py, a
//     ParameterServer actor and two DataWorker actors, synchronous and
//     asynchronous) on the tutorial's model and data, from the virtual
//     environment scripts/setup.sh bench makes (.peers-venv, Ray from PyPI).
// (r) A lookup's round trip: a trainer asks its server for 4 ids of a
//     table in another process and gets the pooled row back; beside a Ray
//     actor call's round trip.
//
// Every process gets OpenBLAS's kernel named in the report's first note.
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "report.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/parameter_server.hpp"

using namespace troupe;

namespace {

/// Runs `command`, returns its stdout (and whether it exited 0).
std::pair<bool, std::string> run(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe)
    return {false, out};
  char buffer[4096];
  while (auto n = std::fread(buffer, 1, sizeof buffer, pipe))
    out.append(buffer, n);
  return {::pclose(pipe) == 0, out};
}

/// Sum of the trainers' "timed N iterations in S s" rates.
std::optional<double> troupe_rate(const std::string& out) {
  std::regex line(R"(trainer \d+: timed (\d+) iterations in ([0-9.]+) s)");
  double total = 0;
  int trainers = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    total += std::stod((*it)[1]) / std::stod((*it)[2]);
    ++trainers;
  }
  if (trainers != 2)
    return std::nullopt;
  return total;
}

std::optional<double> peer_rate(const std::string& out) {
  std::smatch m;
  std::regex field(R"("aggregate_iters_per_s": ([0-9.eE+-]+))");
  if (!std::regex_search(out, m, field))
    return std::nullopt;
  return std::stod(m[1]);
}

/// --child=lookup, under troupe-launch -n 2: rank 1 serves a table, rank 0
/// times `calls` lookups of 4 ids and prints the median round trip.
int lookup_child(int argc, char** argv) {
  troupe::job job(argc, argv);
  const auto calls = job.flag("calls", 2000, 10, 1'000'000);
  (void)job.flag("child", "lookup", {"lookup"});
  job.start();
  parallel::parameter_server_options o;
  o.tables = {{.name = "emb", .rows = 100000, .dim = 16, .consistency = parallel::consistency::asynchronous()}};
  o.servers = {job.places()[1]};
  o.trainers = {job.places()[0]};
  if (job.rank() == 1) {
    auto server = job.must(parallel::parameter_server::host(job, o));
    return job.serve();
  }
  auto client = job.must(parallel::parameter_client::connect(job, o));
  auto ids = tensor::from(std::vector<std::int64_t>{17, 4242, 99999, 5}, {4});
  auto offsets = tensor::from(std::vector<std::int64_t>{0}, {1});
  std::vector<double> times;
  for (std::int64_t i = 0; i < calls + 100; ++i) {
    auto start = bench::now_seconds();
    job.must(client.lookup("emb", ids, offsets, bag_mode::sum));
    if (i >= 100)
      times.push_back(bench::now_seconds() - start);
  }
  fmt::print("lookup round trip median {:.2f} us over {} calls\n", bench::median(times) * 1e6, times.size());
  return job.finish(0);
}

double resident_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.starts_with("VmRSS:"))
      return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

/// --child=scaled, under troupe-launch -n 4: ranks 0 and 1 train (a
/// data-parallel Linear(dim, 8) over 512 bags of 20 Zipf(1.1) ids), ranks 2
/// and 3 each serve half of a rows x dim table (hashed: id i on server
/// i % 2, as the PyTorch peer splits it), SGD 0.05, synchronous.
int scaled_child(int argc, char** argv) {
  troupe::job job(argc, argv);
  (void)job.flag("child", "scaled", {"scaled"});
  const auto rows = job.flag("rows", 10'000'000, 2, 1'000'000'000);
  const auto dim = job.flag("dim", 64, 1, 4096);
  const auto iters = job.flag("iters", 20, 1, 100'000);
  const auto warmup = job.flag("warmup", 3, 0, 1000);
  const auto mode = job.flag("consistency", "synchronous", {"synchronous", "asynchronous"});
  job.start();
  constexpr std::int64_t bags = 512, bag_size = 20;
  parallel::parameter_server_options o;
  o.tables = {{.name = "emb", .rows = rows, .dim = dim, .optimizer = {.lr = 0.05},
                .consistency = mode == "synchronous" ? parallel::consistency::synchronous()
                                                     : parallel::consistency::asynchronous(),
                .shard_by = parallel::sharding::hashed}};
  o.servers = {job.places()[2], job.places()[3]};
  o.trainers = {job.places()[0], job.places()[1]};
  o.timeout = std::chrono::seconds(60);
  if (job.rank() >= 2) {
    auto server = job.must(parallel::parameter_server::host(job, o));
    auto status = job.serve();
    auto s = server.stats();
    fmt::print("server {}: table {:.0f} MiB, optimizer state {:.0f} MiB, resident {:.0f} MiB, {} ids looked up, "
               "{} rows updated\n",
               job.rank() - 2, s.table_bytes / 1048576.0, s.state_bytes / 1048576.0, resident_mib(), s.ids_looked_up,
               s.rows_updated);
    return status;
  }
  const auto trainer = job.rank();
  auto client = job.must(parallel::parameter_client::connect(job, o));
  auto group = job.must(parallel::reducer_group::join(job, {.rank = trainer, .places = parallel::reducer_places(
                                                                                  {job.nodes()[0], job.nodes()[1]})}));
  auto fc = std::make_shared<nn::linear>(dim, 8, 1);
  auto dp = job.must(parallel::data_parallel::create(fc->named_parameters(), group));
  parallel::remote_embedding_bag emb(client, "emb", bag_mode::sum);
  parallel::distributed_optimizer optimizer(
      std::make_unique<optim::sgd>(fc->named_parameters(), optim::sgd_options{.lr = 0.05}), {&client});
  // Zipf(1.1) by inverse CDF over the ids, as the peer draws them.
  std::vector<double> cdf(static_cast<std::size_t>(rows));
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    cdf[static_cast<std::size_t>(r)] = total += std::pow(static_cast<double>(r + 1), -1.1);
  std::mt19937_64 rng(1000 + trainer);
  std::uniform_real_distribution<double> uniform(0.0, total);
  std::vector<std::int64_t> offsets;
  for (std::int64_t b = 0; b < bags; ++b)
    offsets.push_back(b * bag_size);
  auto offset_tensor = tensor::from(offsets, {bags});
  generator targets{2000 + static_cast<std::uint64_t>(trainer)};
  // Batches are drawn before the loop (as the peer does): the loop times
  // the parameter servers and training, not the sampler.
  std::vector<tensor> batches;
  for (std::int64_t step = 0; step < warmup + iters; ++step) {
    std::vector<std::int64_t> ids(bags * bag_size);
    for (auto& id : ids)
      id = std::min<std::int64_t>(rows - 1, std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin());
    batches.push_back(tensor::from(ids, {bags * bag_size}));
  }
  double started = 0;
  for (std::int64_t step = 1; step <= warmup + iters; ++step) {
    if (step == warmup + 1)
      started = bench::now_seconds();
    optimizer.zero_grad();
    auto loss = autograd::cross_entropy((*fc)(emb(batches[step - 1], offset_tensor)), randint({bags}, targets, 0, 8));
    job.must(dp.backward(loss));
    job.must(optimizer.step());
  }
  const double seconds = bench::now_seconds() - started;
  fmt::print("trainer {}: timed {} iterations in {:.4f} s ({:.1f} it/s)\n", trainer, iters, seconds, iters / seconds);
  return job.finish(0);
}

} // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--child=lookup")
      return lookup_child(argc, argv);
    if (std::string_view(argv[i]) == "--child=scaled")
      return scaled_child(argc, argv);
  }
  bench::check_flags("parameter_server", argc, argv, {"rounds=", "epochs=", "rows=", "no-peers", "quick"});
  bench::report out("parameter_server", argc, argv);
  bool quick = false, peers = true;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::string_view(argv[i]) == "--quick";
    peers = peers && std::string_view(argv[i]) != "--no-peers";
  }
  const auto rounds = bench::int_option(argc, argv, "rounds", quick ? 1 : 3, 1, 100);
  const auto epochs = bench::int_option(argc, argv, "epochs", quick ? 2 : 100, 1, 100000);
  const auto self = std::filesystem::canonical("/proc/self/exe");
  const auto build = self.parent_path().parent_path();
  const auto launch = (build / "bin" / "troupe-launch").string();
  const auto demo = (build / "examples" / "parameter_server_demo").string();
  const std::string peer = std::string(TROUPE_SOURCE_DIR) + "/bench/peers/ddp_rpc_hybrid.py";

  auto troupe_run = [&](const std::string& mode) {
    auto [ok, text] = run(fmt::format("OPENBLAS_NUM_THREADS=1 timeout 300 {} -n 4 -- {} --epochs={} --warmup=5 "
                                      "--print-losses=0 --consistency={} 2>&1",
                                      launch, demo, epochs, mode));
    auto rate = ok ? troupe_rate(text) : std::nullopt;
    if (!rate)
      out.note("troupe's {} run failed: {}", mode, text.substr(text.size() > 600 ? text.size() - 600 : 0));
    return rate;
  };

  // (a) alternated rounds, troupe then PyTorch.
  std::vector<double> ours, theirs;
  for (std::int64_t r = 0; r < rounds; ++r) {
    if (auto rate = troupe_run("synchronous"))
      ours.push_back(*rate);
    if (!peers)
      continue;
    auto [ok, text] = run(fmt::format("timeout 300 /usr/bin/python3 {} --runs default:tutorial --epochs {} 2>&1", peer,
                                      epochs));
    if (auto rate = ok ? peer_rate(text) : std::nullopt)
      theirs.push_back(*rate);
    else
      out.note("the PyTorch RPC peer failed: {}", text.substr(text.size() > 600 ? text.size() - 600 : 0));
  }
  if (!ours.empty()) {
    bench::row row{"tutorial topology (4 processes, synchronous)", "aggregate iterations/s", bench::median(ours), "it/s", "", std::nullopt, ""};
    if (!theirs.empty()) {
      row.baseline = "PyTorch RPC + DDP (TensorPipe, gloo)";
      row.baseline_value = bench::median(theirs);
    }
    row.note = fmt::format("{} epochs x 10 batches per trainer, median of {} rounds (troupe {:.0f}-{:.0f}{})", epochs,
                           ours.size(), *std::min_element(ours.begin(), ours.end()),
                           *std::max_element(ours.begin(), ours.end()),
                           theirs.empty() ? std::string()
                                          : fmt::format(", PyTorch {:.0f}-{:.0f}",
                                                        *std::min_element(theirs.begin(), theirs.end()),
                                                        *std::max_element(theirs.begin(), theirs.end())));
    out.add(row);
  }

  // (c) consistency modes, troupe only, alternated.
  std::map<std::string, std::vector<double>> by_mode;
  for (std::int64_t r = 0; r < rounds; ++r)
    for (const std::string mode : {"synchronous", "bounded", "asynchronous"})
      if (auto rate = troupe_run(mode))
        by_mode[mode].push_back(*rate);
  for (auto& [mode, rates] : by_mode)
    out.add({fmt::format("tutorial topology, {}{}", mode, mode == "bounded" ? " (staleness 2)" : ""),
             "aggregate iterations/s", bench::median(rates), "it/s", "", std::nullopt,
             fmt::format("median of {} rounds", rates.size())});

  // (b) the scaled sparse case, alternated with the PyTorch peer.
  const auto rows = bench::int_option(argc, argv, "rows", quick ? 1'000'000 : 10'000'000, 2, 1'000'000'000);
  const auto iters = quick ? 10 : 100;
  std::map<std::string, std::vector<double>> ours_scaled;
  std::vector<double> theirs_scaled, server_mib, peer_mib, updated_per_step;
  const std::regex server_line(
      R"(server \d+: table ([0-9.]+) MiB, optimizer state ([0-9.]+) MiB, resident ([0-9.]+) MiB, (\d+) ids looked up, (\d+) rows updated)");
  for (std::int64_t r = 0; r < rounds; ++r) {
    for (const std::string mode : {"synchronous", "asynchronous"}) {
      auto [ok_run, text_run] = run(fmt::format("OPENBLAS_NUM_THREADS=1 timeout 600 {} -n 4 -- {} --child=scaled "
                                                "--rows={} --iters={} --warmup=3 --consistency={} 2>&1",
                                                launch, self.string(), rows, iters, mode));
      auto rate = ok_run ? troupe_rate(text_run) : std::nullopt;
      if (!rate) {
        out.note("troupe's scaled {} run failed: {}", mode,
                 text_run.substr(text_run.size() > 600 ? text_run.size() - 600 : 0));
        continue;
      }
      ours_scaled[mode].push_back(*rate);
      if (mode != "synchronous")
        continue;
      double updated = 0;
      for (std::sregex_iterator it(text_run.begin(), text_run.end(), server_line), end; it != end; ++it) {
        server_mib.push_back(std::stod((*it)[3]));
        updated += std::stod((*it)[5]);
      }
      updated_per_step.push_back(updated / static_cast<double>(iters + 3));
    }
    if (!peers)
      continue;
    auto [ok_peer, text_peer] = run(fmt::format("timeout 600 /usr/bin/python3 {}/bench/peers/ps_zipf_torch.py "
                                                "--rows {} --iters {} --warmup 3 2>&1",
                                                TROUPE_SOURCE_DIR, rows, iters));
    if (auto peer = ok_peer ? peer_rate(text_peer) : std::nullopt) {
      theirs_scaled.push_back(*peer);
      std::smatch rss;
      if (std::regex_search(text_peer, rss, std::regex(R"("server_rss_mib": \[([0-9.]+), ([0-9.]+)\])"))) {
        peer_mib.push_back(std::stod(rss[1]));
        peer_mib.push_back(std::stod(rss[2]));
      }
    } else {
      out.note("the PyTorch scaled peer failed: {}", text_peer.substr(text_peer.size() > 600 ? text_peer.size() - 600 : 0));
    }
  }
  const auto scaled_name = fmt::format("{}M x 64 table, 2 servers, 2 trainers, 512 bags x 20 Zipf(1.1) ids",
                                       rows / 1'000'000);
  for (auto& [mode, rates] : ours_scaled) {
    bench::row row{scaled_name + ", " + mode, "aggregate iterations/s", bench::median(rates), "it/s", "", std::nullopt,
                   fmt::format("median of {} rounds (troupe {:.0f}-{:.0f}{})", rates.size(),
                               *std::min_element(rates.begin(), rates.end()),
                               *std::max_element(rates.begin(), rates.end()),
                               theirs_scaled.empty() ? std::string()
                                                     : fmt::format(", PyTorch {:.0f}-{:.0f}",
                                                                   *std::min_element(theirs_scaled.begin(), theirs_scaled.end()),
                                                                   *std::max_element(theirs_scaled.begin(), theirs_scaled.end())))};
    if (!theirs_scaled.empty()) {
      row.baseline = "PyTorch RPC, sparse=True (unordered)";
      row.baseline_value = bench::median(theirs_scaled);
    }
    out.add(row);
  }
  if (auto sync = ours_scaled.find("synchronous"); sync != ours_scaled.end()) {
    const double rate = bench::median(sync->second);
    const double lookups = rate * 512 * 20;
    bench::row ids_row{scaled_name + ", synchronous", "ids looked up per second", lookups, "ids/s", "", std::nullopt, ""};
    if (!theirs_scaled.empty()) {
      ids_row.baseline = "PyTorch RPC, sparse=True (unordered)";
      ids_row.baseline_value = bench::median(theirs_scaled) * 512 * 20;
    }
    out.add(ids_row);
    // Bytes the servers' rows moved: a row read per id looked up, a read
    // and a write per row updated; against memcpy's rate on this machine
    // now (read + write of a 256 MiB buffer).
    const double rows_per_second = bench::median(updated_per_step) * rate / 2;
    const double moved = (lookups + 2 * rows_per_second) * 64 * 4;
    std::vector<char> from(256 << 20, 1), to(256 << 20);
    auto copy_seconds = bench::time_per_call([&] { std::memcpy(to.data(), from.data(), from.size()); }, 1.0);
    const double memcpy_rate = 2.0 * static_cast<double>(from.size()) / copy_seconds;
    out.add({scaled_name + ", synchronous", "rows updated per second", rows_per_second, "rows/s", "", std::nullopt,
             fmt::format("servers moved {:.2f} GB/s of rows, {:.1f}% of memcpy's {:.1f} GB/s (read + write)",
                         moved / 1e9, 100 * moved / memcpy_rate, memcpy_rate / 1e9)});
    out.add({scaled_name, "server resident memory", bench::median(server_mib), "MiB",
             peer_mib.empty() ? "" : "PyTorch RPC server",
             peer_mib.empty() ? std::nullopt : std::optional<double>(bench::median(peer_mib)),
             fmt::format("table share {:.0f} MiB per server, SGD keeps no state", rows * 64 * 4 / 2 / 1048576.0)});
  }

  // (d) Ray's documented parameter-server pattern on the same work, and a
  // Ray actor call's round trip, from the bench's virtual environment.
  const std::string ray_python = std::string(TROUPE_SOURCE_DIR) + "/.peers-venv/bin/python";
  std::vector<double> ray_sync, ray_async, ray_call_us;
  if (peers && std::filesystem::exists(ray_python)) {
    for (std::int64_t r = 0; r < rounds; ++r) {
      auto [ok_ray, text_ray] = run(fmt::format("timeout 300 {} {}/bench/peers/ps_ray.py --iters {} --calls {} 2>&1",
                                                ray_python, TROUPE_SOURCE_DIR, quick ? 50 : 300, quick ? 200 : 2000));
      std::smatch m_sync, m_async, m_call;
      if (ok_ray && std::regex_search(text_ray, m_sync, std::regex(R"("sync_iters_per_s": ([0-9.eE+-]+))")) &&
          std::regex_search(text_ray, m_async, std::regex(R"("async_iters_per_s": ([0-9.eE+-]+))")) &&
          std::regex_search(text_ray, m_call, std::regex(R"("actor_call_round_trip_us": ([0-9.eE+-]+))"))) {
        ray_sync.push_back(std::stod(m_sync[1]));
        ray_async.push_back(std::stod(m_async[1]));
        ray_call_us.push_back(std::stod(m_call[1]));
      } else {
        out.note("the Ray peer failed: {}", text_ray.substr(text_ray.size() > 600 ? text_ray.size() - 600 : 0));
      }
    }
  } else if (peers) {
    out.note("Ray is not set up ({} missing; bash scripts/setup.sh bench creates it)", ray_python);
  }
  for (auto [mode, ray] : {std::pair{std::string("synchronous"), &ray_sync}, {std::string("asynchronous"), &ray_async}})
    if (!ray->empty() && by_mode.contains(mode))
      out.add({fmt::format("tutorial topology's work, {}", mode), "aggregate iterations/s",
               bench::median(by_mode[mode]), "it/s", "Ray parameter-server actor (docs' pattern)", bench::median(*ray),
               fmt::format("Ray {:.0f}-{:.0f} over {} rounds", *std::min_element(ray->begin(), ray->end()),
                           *std::max_element(ray->begin(), ray->end()), ray->size())});

  // (r) a lookup's round trip across processes.
  auto [ok, text] = run(fmt::format("OPENBLAS_NUM_THREADS=1 timeout 120 {} -n 2 -- {} --child=lookup --calls={} 2>&1",
                                    launch, self.string(), quick ? 200 : 5000));
  std::smatch m;
  if (ok && std::regex_search(text, m, std::regex(R"(median ([0-9.]+) us)"))) {
    const double ours_us = std::stod(m[1]);
    bench::row row{"lookup of 4 ids, pooled row back (2 processes)", "round trip", ours_us, "us", "", std::nullopt,
                   "data plane, server thread, router sink"};
    if (!ray_call_us.empty()) {
      row.baseline = "Ray actor call, no arguments";
      row.baseline_value = bench::median(ray_call_us);
      row.note += fmt::format("; {:.1f}x faster than the Ray call", bench::median(ray_call_us) / ours_us);
    }
    out.add(row);
  }
  else
    out.note("the lookup round trip failed: {}", text.substr(text.size() > 600 ? text.size() - 600 : 0));
  out.print();
  return 0;
}
