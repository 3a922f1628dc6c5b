// Float32 sum allreduce through troupe's reducer groups, 4 KiB to 64 MiB on
// 2 and 4 processes, in the nccl-tests manner (size, count, time, algbw,
// busbw = 2(n-1)/n * bytes / time, #wrong from checking every element
// against the expected sum), beside Gloo and Open MPI over shared memory
// from bench/peers/allreduce.py in the same run. --collective=reduce_scatter
// or all_gather times those instead, as nccl-tests does: the size is the
// whole tensor (a reduce-scatter's input, an all-gather's output) and
// busbw = (n-1)/n * bytes / time; Gloo has no reduce-scatter, so only Open
// MPI's Reduce_scatter_block runs beside it. --collective=broadcast times a
// broadcast from the last rank (busbw = bytes / time, as nccl-tests' is),
// beside MPI's Bcast and Gloo's broadcast. Both of troupe's
// same-host algorithms run, interleaved case by case: the shared-memory
// workspaces (the default on one host) and the ring of messages (what runs
// between hosts).
//
//   build/bench/allreduce [--json] [--quick] [--no-peers] [--chunk-kib=1024] [--min-chunks=4]
//                         [--pass-kib=1024] [--algorithm=both|shared-memory|ring]
//                         [--collective=allreduce|reduce_scatter|all_gather|broadcast] [--single-copy=on|off]
//
// Each side runs twice, interleaved (peers, troupe, peers, troupe; once with
// --quick), and keeps its better median per size.
//
// This process is rank 0 and re-executes itself as ranks 1..n-1
// (--child=rank); the ring's chunks travel over the data plane. Rank 0 tells the
// others on stdin what to run; each iteration every rank refills its buffer
// with rank+1 (untimed), the ranks meet in the collective, and rank 0 times
// it: the ring cannot finish on one rank before every rank has sent.
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "baselines.hpp"
#include "peer_process.hpp"
#include "rank_processes.hpp"
#include "report.hpp"
#include "troupe/parallel/collectives.hpp"

using namespace troupe;
using namespace troupe::parallel;
using namespace std::chrono_literals;

namespace {

/// Chunk size of the ring (--chunk-kib=N, default the group's) and the
/// least chunks per segment (--min-chunks=N).
std::size_t chunk_bytes = reducer_group_options{}.chunk_bytes;
std::uint32_t min_chunks = reducer_group_options{}.min_chunks;
/// Pass size of the shared-memory allreduce (--pass-kib=N).
std::size_t pass_bytes = reducer_group_options{}.same_host_pass_bytes;
/// Whether the peers read all-gather pieces from their owners' memory
/// (--single-copy=on|off).
bool single_copy = reducer_group_options{}.same_host_single_copy;
/// Which cases run (--algorithm=...): index 0 shared memory, 1 ring, both
/// on heap tensors; 2 shared memory on tensors in the node's arena
/// (reducer_group::buffer: the peers read an allreduce's or a broadcast
/// root's where they lie; an all-gather's output, as all_gather() allocates
/// it: the peers write into it), which runs whenever 0 does (not for a
/// reduce-scatter).
constexpr int cases = 3;
bool runs[cases] = {true, true, true};
constexpr const char* algorithm_names[cases] = {"shared-memory", "ring", "shared-memory, arena buffers"};
/// Which collective is timed (--collective=...).
enum class collective { allreduce, reduce_scatter, all_gather, broadcast };
collective timed = collective::allreduce;
constexpr const char* collective_names[] = {"allreduce", "reduce_scatter", "all_gather", "broadcast"};
const char* name_of(collective c) { return collective_names[static_cast<int>(c)]; }
/// nccl-tests' bus bandwidth factor: what each rank must send per byte
/// (a broadcast's is 1: its bus bandwidth is its algorithm bandwidth).
double bus_factor(std::uint32_t n) {
  if (timed == collective::broadcast)
    return 1.0;
  return (timed == collective::allreduce ? 2.0 : 1.0) * (n - 1) / n;
}
/// The group a case runs on (index as in `groups`).
int group_of(int c) { return c == 1 ? 1 : 0; }

reducer_group_options group_options(std::uint32_t rank, std::uint32_t n, int algorithm) {
  reducer_group_options o;
  o.rank = rank;
  for (std::uint32_t k = 0; k < n; ++k)
    o.places.push_back(fmt::format("worker{}/cpu/{}{}", k, algorithm == 0 ? "shm" : "ring", k));
  o.chunk_bytes = chunk_bytes;
  o.min_chunks = min_chunks;
  o.same_host = algorithm == 0 ? same_host_algorithm::shared_memory : same_host_algorithm::ring;
  o.same_host_pass_bytes = pass_bytes;
  o.same_host_single_copy = single_copy;
  return o;
}

/// One group per algorithm that runs (index as in `runs`).
using groups = std::optional<reducer_group>[2];

expected<void> join_all(actors::node& node, groups& out) {
  for (int a = 0; a < 2; ++a)
    if (runs[a]) {
      auto g = reducer_group::join(node, group_options(node.rank(), node.options().world_size, a));
      if (!g)
        return g.error();
      if (a == 0 && !g->shares_memory())
        return make_error(errc::invalid_argument, "the ranks did not agree on shared memory (not one host?)");
      out[a].emplace(std::move(*g));
    }
  return {};
}

/// Elements of `t` (contiguous float32) other than `want` (untimed).
std::int64_t count_not(const tensor& t, float want) {
  const float* p = t.data<float>();
  std::int64_t wrong = 0;
  for (std::int64_t j = 0; j < t.numel(); ++j)
    wrong += p[j] != want;
  return wrong;
}

/// One call of the timed collective on `data` (`count` floats in all);
/// returns the wrong elements of its result (0 unless `check`).
expected<std::int64_t> run_once(reducer_group& g, tensor& data, const tensor& gathered, bool check) {
  const auto n = g.size();
  switch (timed) {
  case collective::allreduce: {
    if (auto ok = ring_allreduce(g, data); !ok)
      return ok.error();
    return check ? count_not(data, static_cast<float>(n * (n + 1) / 2)) : 0;
  }
  case collective::reduce_scatter: {
    auto mine = reduce_scatter(g, data);
    if (!mine)
      return mine.error();
    return check ? count_not(*mine, static_cast<float>(n * (n + 1) / 2)) : 0;
  }
  case collective::all_gather: {
    // Into a buffer in the node's arena (case 2, and what all_gather()
    // returns): the peers write into it; or into the heap (case 0).
    if (auto ok = all_gather_into(g, data, gathered); !ok)
      return ok.error();
    std::int64_t wrong = 0;
    const auto m = data.numel();
    for (std::uint32_t k = 0; k < n && check; ++k)
      wrong += count_not(gathered.slice(0, k * m, (k + 1) * m), static_cast<float>(k + 1));
    return wrong;
  }
  case collective::broadcast: { // from the last rank, so that rank 0, which times, receives
    if (auto ok = broadcast(g, data, {.root = n - 1}); !ok)
      return ok.error();
    return check ? count_not(data, static_cast<float>(n)) : 0;
  }
  }
  return 0;
}

/// `iters` timed collectives (after 2 warm-ups) of `count` floats (an
/// all-gather's output: each rank gives count / n); returns the
/// per-iteration seconds and adds the wrong elements to `wrong`.
expected<std::vector<double>> run_case(reducer_group& g, std::int64_t count, int iters, bool in_arena,
                                       std::int64_t& wrong) {
  const bool gathering = timed == collective::all_gather;
  const auto mine = gathering ? count / g.size() : count;
  // In the arena: the allreduce's or broadcast's tensor (read in place), the all-gather's output.
  auto data = in_arena && !gathering ? g.buffer({mine}) : tensor::empty({mine}, dtype::float32);
  const auto gathered = !gathering ? tensor() : in_arena ? g.buffer({count}) : tensor::empty({count}, dtype::float32);
  std::vector<double> times;
  // An allreduce sums in place, so its input is refilled before every call
  // and every result checked. A reduce-scatter or all-gather leaves its
  // input as it was: the calls run back to back, as the peers' do, and the
  // last result is checked (a check between calls, untimed on this rank,
  // would hold up the others' next call and count in their times).
  const bool refill = timed == collective::allreduce;
  data.fill(g.rank() + 1.0);
  for (int i = 0; i < iters + 2; ++i) {
    if (refill)
      data.fill(g.rank() + 1.0);
    auto start = bench::now_seconds();
    auto bad = run_once(g, data, gathered, refill || i == iters + 1);
    auto elapsed = bench::now_seconds() - start;
    if (!bad)
      return bad.error();
    if (i >= 2)
      times.push_back(elapsed);
    wrong += *bad;
  }
  return times;
}

int child(int argc, char** argv) {
  auto options = actors::node_options::from(argc, argv);
  if (!options)
    return 2;
  auto started = actors::node::start(*options);
  if (!started) {
    std::printf("ERROR %s\n", started.error().message().c_str());
    return 3;
  }
  auto& node = **started;
  {
    groups group;
    if (auto joined = join_all(node, group); !joined) {
      std::printf("ERROR %s\n", joined.error().message().c_str());
      std::fflush(stdout);
      node.stop();
      return 4;
    }
    std::printf("READY\n");
    std::fflush(stdout);
    std::string line;
    char c;
    while (read(0, &c, 1) == 1) {
      if (c != '\n') {
        line += c;
        continue;
      }
      if (line == "quit")
        break;
      std::istringstream in(line);
      std::int64_t count = 0;
      int iters = 0, algorithm = 0;
      in >> count >> iters >> algorithm;
      std::int64_t wrong = 0;
      auto times = run_case(*group[group_of(algorithm)], count, iters, algorithm == 2, wrong);
      if (times)
        std::printf("DONE %lld\n", static_cast<long long>(wrong));
      else
        std::printf("FAILED %s\n", times.error().message().c_str());
      std::fflush(stdout);
      line.clear();
    }
  }
  node.stop();
  return 0;
}

std::string human(std::int64_t bytes) {
  if (bytes >= (1 << 20))
    return fmt::format("{}M", bytes >> 20);
  return fmt::format("{}K", bytes >> 10);
}

/// Peer busbw (GB/s) keyed "impl/n/bytes" from allreduce.py's JSON lines.
std::map<std::string, double> peers(std::uint32_t n, const std::vector<std::int64_t>& sizes, bool quick) {
  std::map<std::string, double> out;
  std::string list;
  for (auto s : sizes)
    list += (list.empty() ? "" : ",") + std::to_string(s);
  auto script = std::string(TROUPE_SOURCE_DIR) + "/bench/peers/allreduce.py";
  const char* impls = timed == collective::reduce_scatter ? "mpi-shm" : "gloo,mpi-shm";
  auto output = bench::run_command(fmt::format("/usr/bin/python3 {} --impls {} --collective {} --nprocs {} --sizes {}{}",
                                               script, impls, name_of(timed), n, list, quick ? " --quick" : ""),
                                   300);
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{')
      continue;
    auto impl_at = line.find("\"impl\": \"");
    auto bus_at = line.find("\"busbw_GBps\"");
    auto bytes = bench::json_number(line, "bytes");
    if (impl_at == std::string::npos || bus_at == std::string::npos || !bytes)
      continue;
    auto start = impl_at + 9;
    auto impl = line.substr(start, line.find('"', start) - start);
    auto median = bench::json_number(line.substr(bus_at + 12), "median");
    if (median)
      out[fmt::format("{}/{}/{}", impl, n, static_cast<long long>(*bytes))] = *median;
  }
  return out;
}

int parent(int argc, char** argv) {
  // A rank that died must end in an error naming it, not in SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  bench::report out("allreduce", argc, argv);
  bool quick = false, no_peers = false;
  for (int i = 1; i < argc; ++i) {
    quick |= std::string_view(argv[i]) == "--quick";
    no_peers |= std::string_view(argv[i]) == "--no-peers";
  }
  std::vector<std::int64_t> sizes{4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  if (quick)
    sizes = {4 << 10, 1 << 20, 16 << 20};
  std::vector<std::uint32_t> ranks = quick ? std::vector<std::uint32_t>{2} : std::vector<std::uint32_t>{2, 4};
  if (!no_peers && access("/usr/bin/python3", X_OK) != 0) {
    out.note("python3 missing: peer columns skipped");
    no_peers = true;
  }
  bool any_wrong = false;
  std::vector<std::string> table;
  table.push_back(fmt::format("{:>2} {:>6} {:>10} {:>10} {:>8} {:>10} {:>10} {:>10} {:>7} {:>10} {:>10}", "n",
                              "size", "count", "time(us)", "algbw", "busbw:shm", "shm:arena", "busbw:ring", "#wrong",
                              "gloo", "mpi-shm"));
  for (auto n : ranks) {
    // Rounds alternate: the peers, then troupe, then the peers again, then
    // troupe again; each side keeps its better figure per size. This
    // machine's speed drifts by 2x within a minute, and a single pair of
    // runs compares whatever phases each side happened to get.
    std::map<std::string, double> peer;
    auto run_peers = [&] {
      if (no_peers)
        return;
      auto got = peers(n, sizes, quick);
      bench::settle_after_peer();
      if (got.empty())
        out.note("allreduce.py gave no figures for n={} (python3-torch / openmpi missing?): peer columns skipped", n);
      else if (timed == collective::reduce_scatter)
        out.note("Gloo has no reduce-scatter (torch {}): its column stays empty", "1.13");
      else if (std::none_of(got.begin(), got.end(), [](const auto& kv) { return kv.first.starts_with("mpi-shm/"); }))
        out.note("allreduce.py gave no Open MPI figures for n={} (openmpi-bin / python3-mpi4py missing?): mpi-shm column skipped", n);
      for (const auto& [key, value] : got)
        peer[key] = std::max(peer[key], value);
    };
    run_peers();
    auto node = bench::start_rank_zero(n);
    auto children = bench::start_ranks(
        *node, n, "rank",
        {fmt::format("--chunk-kib={}", chunk_bytes >> 10), fmt::format("--min-chunks={}", min_chunks),
         fmt::format("--pass-kib={}", pass_bytes >> 10), fmt::format("--single-copy={}", single_copy ? "on" : "off"),
         fmt::format("--algorithm={}", runs[0] && runs[1] ? "both" : algorithm_names[runs[0] ? 0 : 1]),
         fmt::format("--collective={}", name_of(timed))});
    {
      groups group;
      if (auto joined = join_all(*node, group); !joined)
        throw std::runtime_error(joined.error().message());
      for (auto& c : children) {
        auto line = c->read_line(30'000).value_or("");
        if (!line.starts_with("READY"))
          throw std::runtime_error("rank did not start: " + line);
      }
      // Per size: troupe's best busbw and time per algorithm, wrong elements.
      struct figures {
        double busbw[cases] = {0, 0, 0};
        double seconds[cases] = {0, 0, 0};
        std::int64_t wrong = 0;
      };
      std::map<std::int64_t, figures> best;
      const int rounds = quick ? 1 : 2;
      for (int round = 0; round < rounds; ++round) {
        if (round > 0)
          run_peers(); // troupe's ranks wait on their stdin meanwhile
        for (auto bytes : sizes) {
          const auto count = bytes / 4;
          int iters = quick ? 5 : static_cast<int>(std::clamp<std::int64_t>((256 << 20) / bytes, 5, 200));
          auto& f = best[bytes];
          for (int a = 0; a < cases; ++a) {
            if (!runs[a])
              continue;
            for (auto& c : children)
              c->tell(fmt::format("{} {} {}", count, iters, a)); // the answer comes after the run
            auto times = run_case(*group[group_of(a)], count, iters, a == 2, f.wrong);
            if (!times)
              throw std::runtime_error(fmt::format("{} procs, {}, {}: {}", n, human(bytes), algorithm_names[a],
                                                   times.error().message()));
            for (auto& c : children) {
              auto line = c->read_line(120'000).value_or("FAILED no answer");
              std::istringstream in(line);
              std::string word;
              std::int64_t theirs = 0;
              in >> word >> theirs;
              if (word != "DONE")
                throw std::runtime_error(fmt::format("{} procs, {}: a rank failed: {}", n, human(bytes), line));
              f.wrong += theirs;
            }
            const double t = bench::median(*times);
            const double busbw = static_cast<double>(bytes) / t / 1e9 * bus_factor(n);
            if (busbw > f.busbw[a]) {
              f.busbw[a] = busbw;
              f.seconds[a] = t;
            }
          }
        }
      }
      for (auto bytes : sizes) {
        const auto& f = best[bytes];
        any_wrong |= f.wrong != 0;
        auto key = [&](const char* impl) { return fmt::format("{}/{}/{}", impl, n, bytes); };
        auto gloo = peer.count(key("gloo")) ? std::optional<double>(peer[key("gloo")]) : std::nullopt;
        auto mpi = peer.count(key("mpi-shm")) ? std::optional<double>(peer[key("mpi-shm")]) : std::nullopt;
        auto col = [](std::optional<double> v) { return v ? fmt::format("{:10.3f}", *v) : fmt::format("{:>10}", "-"); };
        auto ours = [&](int a) { return runs[a] ? std::optional<double>(f.busbw[a]) : std::nullopt; };
        const int shown = runs[0] ? 0 : 1; // the time and algbw columns: shared memory when it ran
        table.push_back(fmt::format("{:>2} {:>6} {:>10} {:>10.1f} {:>8.3f} {} {} {} {:>7} {} {}", n, human(bytes),
                                    bytes / 4, f.seconds[shown] * 1e6,
                                    static_cast<double>(bytes) / f.seconds[shown] / 1e9, col(ours(0)), col(ours(2)),
                                    col(ours(1)),
                                    f.wrong ? fmt::format("{} WRONG", f.wrong) : "0", col(gloo), col(mpi)));
        auto note = f.wrong ? fmt::format("{} WRONG", f.wrong) : std::string("#wrong 0");
        for (int a = 0; a < cases; ++a) {
          if (!runs[a])
            continue;
          auto name = timed == collective::allreduce
                        ? fmt::format("troupe {}, {} procs, {}", algorithm_names[a], n, human(bytes))
                        : fmt::format("troupe {} {}, {} procs, {}", name_of(timed), algorithm_names[a], n,
                                      human(bytes));
          out.add({name, "busbw", f.busbw[a], "GB/s", gloo ? "gloo" : "", gloo, note});
          if (mpi)
            out.add({name, "busbw", f.busbw[a], "GB/s", "mpi-shm", mpi, note});
        }
      }
      for (auto& c : children)
        c->ask("quit", 0);
      children.clear(); // waits, then kills by pid if needed
    }
    node->stop();
  }
  if (!out.json()) {
    fmt::print("# {}, float32, busbw = {} * bytes / time (GB/s); time and algbw of the first\n", name_of(timed),
               timed == collective::allreduce   ? "2(n-1)/n"
               : timed == collective::broadcast ? "1"
                                                : "(n-1)/n");
    fmt::print("# troupe column that ran; shm: shared-memory workspaces (heap tensors), shm:arena: the same with\n"
               "# tensors in the node's arena (reducer_group::buffer: an allreduce's or a broadcast root's read in\n"
               "# place, an all-gather's output written by the peers), ring: the ring's messages;\n"
               "# peers' busbw beside;\n"
               "# each side's better median of two interleaved rounds (one with --quick)\n");
    for (const auto& l : table)
      fmt::print("{}\n", l);
  }
  out.print();
  return any_wrong ? 1 : 0;
}

} // namespace

int main(int argc, char** argv) {
  chunk_bytes = static_cast<std::size_t>(bench::int_option(argc, argv, "chunk-kib",
                                                            static_cast<std::int64_t>(chunk_bytes >> 10), 1, 1 << 20))
                << 10;
  min_chunks = static_cast<std::uint32_t>(bench::int_option(argc, argv, "min-chunks", min_chunks, 1, 1024));
  pass_bytes = static_cast<std::size_t>(bench::int_option(argc, argv, "pass-kib",
                                                           static_cast<std::int64_t>(pass_bytes >> 10), 4, 1 << 20))
               << 10;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (!arg.starts_with("--algorithm="))
      continue;
    auto which = arg.substr(12);
    if (which != "both" && which != "shared-memory" && which != "ring") {
      fmt::print(stderr, "allreduce: --algorithm is '{}' but must be both, shared-memory or ring\n", which);
      return 2;
    }
    runs[0] = runs[2] = which != "ring";
    runs[1] = which != "shared-memory";
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (!arg.starts_with("--single-copy="))
      continue;
    if (arg != "--single-copy=on" && arg != "--single-copy=off") {
      fmt::print(stderr, "allreduce: --single-copy is '{}' but must be on or off\n", arg.substr(14));
      return 2;
    }
    single_copy = arg == "--single-copy=on";
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (!arg.starts_with("--collective="))
      continue;
    auto which = arg.substr(13);
    auto known = std::find(std::begin(collective_names), std::end(collective_names), which);
    if (known == std::end(collective_names)) {
      fmt::print(stderr,
                 "allreduce: --collective is '{}' but must be allreduce, reduce_scatter, all_gather or broadcast\n",
                 which);
      return 2;
    }
    timed = static_cast<collective>(known - std::begin(collective_names));
    // The arena case: the allreduce's and broadcast's tensors, the all-gather's outputs.
    runs[2] = runs[2] && timed != collective::reduce_scatter;
  }
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--child=rank")
      return child(argc, argv);
  bench::check_flags("allreduce", argc, argv,
                     {"quick", "no-peers", "chunk-kib=", "min-chunks=", "pass-kib=", "algorithm=", "collective=",
                      "single-copy="});
  try {
    return parent(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "allreduce: {}\n", e.what());
    return 1;
  }
}
