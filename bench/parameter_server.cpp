// Parameter servers beside PyTorch RPC, in the same run:
//
//   build/bench/parameter_server [--rounds=3] [--epochs=100] [--no-peers] [--quick] [--json]
//
// (a) The "Combining DDP with Distributed RPC" tutorial topology (master,
//     server with EmbeddingBag(100, 16, sum), 2 data-parallel trainers with
//     Linear(16, 8), SGD 0.05, the tutorial's random batches): troupe's
//     examples/parameter_server_demo over 4 processes against
//     bench/peers/ddp_rpc_hybrid.py's tutorial config, rounds alternated,
//     aggregate iterations/s of both trainers (each side times its loop
//     after 5 warm-up iterations).
// (c) The same topology, synchronous against bounded staleness (2) and
//     asynchronous.
// (r) A lookup's round trip: a trainer asks its server for 4 ids of a
//     table in another process and gets the pooled row back.
//
// Every process gets OpenBLAS's kernel named in the report's first note.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "report.hpp"
#include "troupe/job.hpp"
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
    job.must(client->lookup("emb", ids, offsets, bag_mode::sum));
    if (i >= 100)
      times.push_back(bench::now_seconds() - start);
  }
  fmt::print("lookup round trip median {:.2f} us over {} calls\n", bench::median(times) * 1e6, times.size());
  return job.finish(0);
}

} // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]).starts_with("--child="))
      return lookup_child(argc, argv);
  bench::check_flags("parameter_server", argc, argv, {"rounds=", "epochs=", "no-peers", "quick"});
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

  // (r) a lookup's round trip across processes.
  auto [ok, text] = run(fmt::format("OPENBLAS_NUM_THREADS=1 timeout 120 {} -n 2 -- {} --child=lookup --calls={} 2>&1",
                                    launch, self.string(), quick ? 200 : 5000));
  std::smatch m;
  if (ok && std::regex_search(text, m, std::regex(R"(median ([0-9.]+) us)")))
    out.add({"lookup of 4 ids, pooled row back (2 processes)", "round trip", std::stod(m[1]), "us", "", std::nullopt,
             "data plane, server thread, router sink"});
  else
    out.note("the lookup round trip failed: {}", text.substr(text.size() > 600 ? text.size() - 600 : 0));
  out.print();
  return 0;
}
