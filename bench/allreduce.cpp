// Float32 sum allreduce through troupe's ring of reducer actors, 4 KiB to
// 64 MiB on 2 and 4 processes, in the nccl-tests manner (size, count, time,
// algbw, busbw = 2(n-1)/n * bytes / time, #wrong from checking every
// element against the expected sum), beside Gloo and Open MPI over shared
// memory from ../shared/peers/allreduce.py in the same run.
//
//   build/bench/allreduce [--json] [--quick] [--no-peers] [--chunk-kib=1024] [--min-chunks=4]
//
// This process is rank 0 and re-executes itself as ranks 1..n-1
// (--child=rank); chunks travel over the UCX data plane. Rank 0 tells the
// others on stdin what to run; each iteration every rank refills its buffer
// with rank+1 (untimed), the ranks meet in the collective, and rank 0 times
// it: the ring cannot finish on one rank before every rank has sent.
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "baselines.hpp"
#include "peer_process.hpp"
#include "report.hpp"
#include "troupe/parallel/collectives.hpp"

using namespace troupe;
using namespace troupe::parallel;
using namespace std::chrono_literals;

namespace {

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

/// Chunk size of the ring (--chunk-kib=N, default the group's) and the
/// least chunks per segment (--min-chunks=N).
std::size_t chunk_bytes = reducer_group_options{}.chunk_bytes;
std::uint32_t min_chunks = reducer_group_options{}.min_chunks;

reducer_group_options ring_options(std::uint32_t rank, std::vector<std::string> places) {
  reducer_group_options o;
  o.rank = rank;
  o.places = std::move(places);
  o.chunk_bytes = chunk_bytes;
  o.min_chunks = min_chunks;
  return o;
}

std::vector<std::string> places_for(std::uint32_t n) {
  std::vector<std::string> names;
  for (std::uint32_t k = 0; k < n; ++k)
    names.push_back("worker" + std::to_string(k));
  return reducer_places(names);
}

/// `iters` timed allreduces (after 2 warm-ups) of `count` floats; returns
/// the per-iteration seconds and adds the wrong elements to `wrong`.
expected<std::vector<double>> run_case(reducer_group& g, std::int64_t count, int iters, std::int64_t& wrong) {
  auto data = tensor::empty({count}, dtype::float32);
  const float want = static_cast<float>(g.size() * (g.size() + 1) / 2);
  std::vector<double> times;
  for (int i = 0; i < iters + 2; ++i) {
    data.fill(g.rank() + 1.0);
    auto start = bench::now_seconds();
    auto ok = ring_allreduce(g, data);
    auto elapsed = bench::now_seconds() - start;
    if (!ok)
      return ok.error();
    if (i >= 2)
      times.push_back(elapsed);
    const float* p = data.data<float>();
    for (std::int64_t j = 0; j < count; ++j)
      wrong += p[j] != want;
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
    auto group = reducer_group::join(node, ring_options(node.rank(), places_for(options->world_size)));
    if (!group) {
      std::printf("ERROR %s\n", group.error().message().c_str());
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
      int iters = 0;
      in >> count >> iters;
      std::int64_t wrong = 0;
      auto times = run_case(**group, count, iters, wrong);
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
  auto script = std::string(TROUPE_SOURCE_DIR) + "/../shared/peers/allreduce.py";
  auto output = bench::run_command(fmt::format("/usr/bin/python3 {} --impls gloo,mpi-shm --nprocs {} --sizes {}{}",
                                               script, n, list, quick ? " --quick" : ""),
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
  table.push_back(fmt::format("{:>2} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10}", "n", "size", "count",
                              "time(us)", "algbw", "busbw", "#wrong", "gloo", "mpi-shm"));
  for (auto n : ranks) {
    std::map<std::string, double> peer;
    if (!no_peers) {
      peer = peers(n, sizes, quick);
      bench::settle_after_peer();
      if (peer.empty())
        out.note("allreduce.py gave no figures for n={} (python3-torch / openmpi missing?): peer columns skipped", n);
      else if (std::none_of(peer.begin(), peer.end(), [](const auto& kv) { return kv.first.starts_with("mpi-shm/"); }))
        out.note("allreduce.py gave no Open MPI figures for n={} (openmpi-bin / python3-mpi4py missing?): mpi-shm column skipped", n);
    }
    actors::node_options options;
    options.name = "worker0";
    options.world_size = n;
    options.listen_address = "127.0.0.1";
    auto started = actors::node::start(options);
    if (!started)
      throw std::runtime_error(started.error().message());
    auto node = std::move(*started);
    std::vector<std::unique_ptr<bench::peer_process>> children;
    for (std::uint32_t k = 1; k < n; ++k)
      children.push_back(std::make_unique<bench::peer_process>(std::vector<std::string>{
        self_path(), "--child=rank", fmt::format("--troupe.coordinator=127.0.0.1:{}", node->port()),
        fmt::format("--troupe.rank={}", k), fmt::format("--troupe.world-size={}", n),
        fmt::format("--troupe.name=worker{}", k), "--troupe.listen-address=127.0.0.1",
        fmt::format("--chunk-kib={}", chunk_bytes >> 10), fmt::format("--min-chunks={}", min_chunks)}));
    {
      auto group = reducer_group::join(*node, ring_options(0, places_for(n)));
      if (!group)
        throw std::runtime_error(group.error().message());
      for (auto& c : children) {
        auto line = c->read_line(30'000).value_or("");
        if (!line.starts_with("READY"))
          throw std::runtime_error("rank did not start: " + line);
      }
      for (auto bytes : sizes) {
        const auto count = bytes / 4;
        int iters = quick ? 5 : static_cast<int>(std::clamp<std::int64_t>((256 << 20) / bytes, 5, 200));
        for (auto& c : children)
          c->ask(fmt::format("{} {}", count, iters), 0).has_value(); // the answer comes after the run
        std::int64_t wrong = 0;
        auto times = run_case(**group, count, iters, wrong);
        if (!times)
          throw std::runtime_error(fmt::format("{} procs, {}: {}", n, human(bytes), times.error().message()));
        for (auto& c : children) {
          auto line = c->read_line(120'000).value_or("FAILED no answer");
          std::istringstream in(line);
          std::string word;
          std::int64_t theirs = 0;
          in >> word >> theirs;
          if (word != "DONE")
            throw std::runtime_error(fmt::format("{} procs, {}: a rank failed: {}", n, human(bytes), line));
          wrong += theirs;
        }
        const double t = bench::median(*times);
        const double algbw = static_cast<double>(bytes) / t / 1e9;
        const double busbw = algbw * 2.0 * (n - 1) / n;
        any_wrong |= wrong != 0;
        auto key = [&](const char* impl) { return fmt::format("{}/{}/{}", impl, n, bytes); };
        auto gloo = peer.count(key("gloo")) ? std::optional<double>(peer[key("gloo")]) : std::nullopt;
        auto mpi = peer.count(key("mpi-shm")) ? std::optional<double>(peer[key("mpi-shm")]) : std::nullopt;
        auto col = [](std::optional<double> v) { return v ? fmt::format("{:10.3f}", *v) : fmt::format("{:>10}", "-"); };
        table.push_back(fmt::format("{:>2} {:>6} {:>10} {:>10.1f} {:>8.3f} {:>8.3f} {:>7} {} {}", n, human(bytes),
                                    count, t * 1e6, algbw, busbw, wrong ? fmt::format("{} WRONG", wrong) : "0",
                                    col(gloo), col(mpi)));
        auto name = fmt::format("troupe ring, {} procs, {}", n, human(bytes));
        auto note = wrong ? fmt::format("{} WRONG", wrong) : std::string("#wrong 0");
        out.add({name, "busbw", busbw, "GB/s", gloo ? "gloo" : "", gloo, note});
        if (mpi)
          out.add({name, "busbw", busbw, "GB/s", "mpi-shm", mpi, note});
      }
      for (auto& c : children)
        c->ask("quit", 0);
      children.clear(); // waits, then kills by pid if needed
    }
    node->stop();
  }
  if (!out.json()) {
    fmt::print("# allreduce, float32 sum, busbw = 2(n-1)/n * bytes / time (GB/s); peers' busbw beside\n");
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
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--child=rank")
      return child(argc, argv);
  bench::check_flags("allreduce", argc, argv, {"quick", "no-peers", "chunk-kib=", "min-chunks="});
  try {
    return parent(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "allreduce: {}\n", e.what());
    return 1;
  }
}
