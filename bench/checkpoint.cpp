// Distributed checkpoints: a pipeline of `stages` processes holding about
// --mib MiB of float32 parameters (linear layers of width --width) and
// Adam's state (twice as much again) saves and loads its checkpoint
// (parallel::checkpoints: each stage writes its own shard, in parallel, and
// rank 0 commits), beside the disk's own rate measured in the same run (one
// file of the same size written with fsync, then read back, right before
// and after each round's saves; the mean of the two) and beside
// torch.save / torch.load of the same state in one process
// (bench/peers/checkpoint_torch.py). For the asynchronous save: how long
// save() blocks the training loop against a synchronous save. Last, the
// time from a kill -9 of a rank to the job's first step after its restart
// (examples/check_restart.sh; --no-restart leaves it out).
//
//   build/bench/checkpoint [--json] [--mib=1024] [--width=2048] [--stages=4] [--rounds=2]
//                          [--dir=/tmp/troupe-bench-checkpoint] [--no-peers] [--no-restart]
//
// The writes are fsynced on both sides. Each load is timed twice: warm
// (the files still in the page cache, beside a read of the cached file)
// and cold (the files' cached pages dropped with POSIX_FADV_DONTNEED first,
// beside a read of the file dropped alike: the disk's own read rate).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "baselines.hpp"
#include "rank_processes.hpp"
#include "report.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/parallel/checkpoints.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

struct settings {
  std::int64_t mib = 1024, width = 2048, stages = 4, rounds = 2;
  std::string dir = "/tmp/troupe-bench-checkpoint";
  std::int64_t layers() const { return std::max<std::int64_t>(stages, mib * (1 << 20) / (4 * width * (width + 1))); }
};

settings parse(int argc, char** argv) {
  settings s;
  s.mib = bench::int_option(argc, argv, "mib", 1024, 1, 1 << 16);
  s.width = bench::int_option(argc, argv, "width", 2048, 4, 1 << 15);
  s.stages = bench::int_option(argc, argv, "stages", 4, 1, 16);
  s.rounds = bench::int_option(argc, argv, "rounds", 2, 1, 100);
  s.dir = bench::option(argc, argv, "dir", s.dir);
  return s;
}

parallel::stage_recipe recipe(const settings& s) {
  auto model = [s] {
    auto m = std::make_shared<nn::sequential>();
    for (std::int64_t i = 0; i < s.layers(); ++i) {
      m->append(nn::make<nn::linear>(s.width, s.width, 0));
      m->append(nn::make<nn::relu>());
    }
    m->reset_parameters(0);
    return m;
  };
  return {model, parallel::adam_factory({.lr = 1e-4}), parallel::mse_loss_function()};
}

/// Drops the page cache's clean pages of the file, or of every file under
/// the directory, `path` (written and fsynced): the next read comes from
/// the disk.
void drop_cached_pages(const fs::path& path) {
  auto drop = [](const fs::path& file) {
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw std::runtime_error(fmt::format("cannot open {}", file.string()));
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (!fs::is_directory(path))
    return drop(path);
  for (const auto& entry : fs::recursive_directory_iterator(path))
    if (entry.is_regular_file())
      drop(entry.path());
}

/// Seconds to read the file at `path` in 8 MiB blocks.
double read_seconds(const fs::path& path) {
  std::vector<char> block(8 << 20);
  const double start = bench::now_seconds();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot open {}", path.string()));
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
  return bench::now_seconds() - start;
}

/// The process's peak resident memory in MiB (VmHWM), or 0 when unknown.
double peak_mib(pid_t pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:"))
      return std::stod(line.substr(6)) / 1024.0; // kB
  return 0;
}

struct disk_seconds {
  double write = 0, cold_read = 0, warm_read = 0;
};

/// Seconds to write `bytes` to one new file in `dir` and fsync it, to read
/// it back from the disk (its cached pages dropped) and again from the
/// page cache: the disk's own rates for this amount.
disk_seconds disk_rate(const fs::path& dir, std::uint64_t bytes) {
  const auto path = dir / "disk-rate";
  std::vector<char> block(8 << 20, 1);
  const double start = bench::now_seconds();
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot create {}", path.string()));
  for (std::uint64_t done = 0; done < bytes;) {
    auto n = std::min<std::uint64_t>(block.size(), bytes - done);
    if (::write(fd, block.data(), n) != static_cast<ssize_t>(n))
      throw std::runtime_error(fmt::format("cannot write {}", path.string()));
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  disk_seconds out;
  out.write = bench::now_seconds() - start;
  drop_cached_pages(path);
  out.cold_read = read_seconds(path);
  out.warm_read = read_seconds(path);
  fs::remove(path);
  return out;
}

struct peer_seconds {
  double save = 0, warm_load = 0, cold_load = 0;
};

/// torch.save and torch.load (warm and cold) seconds of the same state, or nullopt.
std::optional<peer_seconds> torch_peer(const settings& s, bench::report& out) {
  auto script = std::string(TROUPE_SOURCE_DIR) + "/bench/peers/checkpoint_torch.py";
  auto output = bench::run_command(fmt::format("/usr/bin/python3 {} --layers {} --width {} --path {}/torch.pt",
                                               script, s.layers(), s.width, s.dir),
                                   900);
  bench::settle_after_peer();
  auto save = bench::json_number(output, "save_seconds");
  auto load = bench::json_number(output, "load_seconds");
  auto cold = bench::json_number(output, "cold_load_seconds");
  if (!save || !load || !cold) {
    out.note("the PyTorch peer gave no figure (python3-torch missing?): {}", output);
    return std::nullopt;
  }
  return peer_seconds{*save, *load, *cold};
}

/// Kill -9 to the first resumed step, as examples/check_restart.sh measures
/// it: pipeline_demo over 3 ranks under `troupe-launch --restarts 1`
/// (heartbeat timeout 3 s), rank 1 killed by the script after a checkpoint
/// and again while the job saves every step. The script also checks that the
/// resumed losses equal an uninterrupted run's; without its closing "OK"
/// line no figure is posted.
void restart_rows(bench::report& out, double loaded_gb, double cold_load_seconds) {
  const auto output =
    bench::run_command(fmt::format("bash {}/examples/check_restart.sh {}/bin {}/examples/pipeline_demo 3",
                                   TROUPE_SOURCE_DIR, TROUPE_BINARY_DIR, TROUPE_BINARY_DIR),
                       600);
  if (output.find("\nOK:") == std::string::npos) {
    out.note("WRONG: the restart check failed, so no restart figure: {}", output);
    return;
  }
  // "<case>: killed rank 1, restarted, resumed at step <n> with the
  // uninterrupted losses; kill to first resumed step <seconds> s"
  // A self-killed rank's line says "restart to first resumed step" instead:
  // its clock starts at the restart, not at a kill, so it is left out.
  constexpr std::string_view marker = "kill to first resumed step ";
  constexpr std::string_view step_marker = "resumed at step ";
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find(marker);
    const auto colon = line.find(':');
    const auto step_at = line.find(step_marker);
    if (at == std::string::npos || colon == std::string::npos || step_at == std::string::npos)
      continue;
    const double seconds = std::stod(line.substr(at + marker.size()));
    const auto step_begin = step_at + step_marker.size();
    const auto step = line.substr(step_begin, line.find(' ', step_begin) - step_begin);
    out.add({fmt::format("restart after kill -9, {}", line.substr(0, colon)), "s", seconds, "s",
             "target: 10 s + the load", 10.0,
             fmt::format("pipeline_demo, 3 ranks; resumed at step {} with the uninterrupted losses; its state "
                         "loads in milliseconds, the {:.1f} GB above from the disk in {:.1f} s",
                         step, loaded_gb, cold_load_seconds)});
  }
}

std::uint64_t checkpoint_bytes(const fs::path& directory) {
  std::uint64_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(directory))
    if (entry.path().extension() == ".shard")
      bytes += entry.file_size();
  return bytes;
}

int parent(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN); // a rank that died is reported by its missing answer, not by killing rank 0
  bench::check_flags("checkpoint", argc, argv,
                     {"mib=", "width=", "stages=", "rounds=", "dir=", "no-peers", "no-restart"});
  bench::report out("checkpoint", argc, argv);
  const auto s = parse(argc, argv);
  bool no_peers = false, no_restart = false;
  for (int i = 1; i < argc; ++i) {
    no_peers |= std::string_view(argv[i]) == "--no-peers";
    no_restart |= std::string_view(argv[i]) == "--no-restart";
  }
  double loaded_gb = 0, cold_load_seconds = 0; // for the restart rows' note
  fs::remove_all(s.dir);
  fs::create_directories(s.dir);
  const auto n = static_cast<std::uint32_t>(s.stages);
  out.note("{} linear layers of width {} (float32) with Adam's state, over {} stage processes; checkpoints in {}",
           s.layers(), s.width, n, s.dir);

  // Every stage process builds the whole model and keeps its slice; only
  // the slice gets values (nn::deferred_init).
  auto node = bench::start_rank_zero(n, std::chrono::minutes(5));
  parallel::register_stage_factory(*node, recipe(s));
  auto children = bench::start_ranks(*node, n, "stage", {fmt::format("--width={}", s.width),
                                                         fmt::format("--mib={}", s.mib),
                                                         fmt::format("--stages={}", s.stages)});
  // Each answers once it has joined and can host stages.
  bench::child_results(children, "stage processes", 300'000);
  auto options = parallel::pipeline_options_from(recipe(s));
  for (std::uint32_t k = 0; k < n; ++k)
    options.places.push_back(fmt::format("worker{}/cpu", k));
  options.timeout = std::chrono::seconds(300);
  {
    const double start = bench::now_seconds();
    auto pipe = parallel::pipeline::create(*node, std::move(options));
    if (!pipe)
      throw std::runtime_error(pipe.error().message());
    const double started = bench::now_seconds() - start;
    generator data{1};
    auto x = randn({4, s.width}, data);
    auto y = randn({4, s.width}, data);
    auto step = [&] {
      auto loss = pipe->train_step(x, y);
      if (!loss)
        throw std::runtime_error(loss.error().message());
    };
    step(); // Adam's state exists from the first step on
    // A stage process holds its layers' parameters, gradients and Adam's two
    // moments: four copies of a 1/n share of the model, at its peak.
    double stage_peak = 0;
    for (const auto& child : children)
      stage_peak = std::max(stage_peak, peak_mib(child->pid()));
    const double model_mib = 4.0 * static_cast<double>(s.layers() * s.width * (s.width + 1)) / (1 << 20);
    out.add({"stage process peak memory", "MiB", stage_peak, "MiB", "4 x its share of the parameters",
             4 * model_mib / n, fmt::format("the whole model is {:.0f} MiB", model_mib)});
    out.add({"pipeline start (the stages build)", "s", started, "", "", std::nullopt, ""});
    auto make = [&](bool asynchronous) {
      auto ckpt = parallel::checkpoints::create({.directory = s.dir, .keep_last = 1, .asynchronous = asynchronous,
                                                 .timeout = std::chrono::seconds(600)});
      ckpt->track(*pipe);
      return std::move(*ckpt);
    };
    auto sync = make(false);
    auto async = make(true);
    std::int64_t at = 0;
    std::vector<double> save_s, load_s, cold_load_s, block_s, async_total_s, disk_write_s, disk_read_s,
      disk_cold_read_s, torch_save_s, torch_load_s, torch_cold_load_s;
    // An untimed save first: the checkpoint's size, for the disk's rate
    // before the first timed save.
    if (auto ok = sync.save(++at); !ok)
      throw std::runtime_error(ok.error().message());
    std::uint64_t bytes = checkpoint_bytes(checkpoint_path(s.dir, static_cast<std::uint64_t>(at)));
    for (std::int64_t r = 0; r < s.rounds; ++r) {
      // The disk's write rate right before and right after the save (a VM's
      // disk drifts by tens of percent within minutes): the mean of the two
      // is the save's baseline.
      const auto before = disk_rate(s.dir, bytes);
      double t = bench::now_seconds();
      if (auto ok = sync.save(++at); !ok)
        throw std::runtime_error(ok.error().message());
      save_s.push_back(bench::now_seconds() - t);
      const auto saved = checkpoint_path(s.dir, static_cast<std::uint64_t>(at));
      bytes = checkpoint_bytes(saved);
      t = bench::now_seconds();
      if (auto ok = sync.load(saved); !ok)
        throw std::runtime_error(ok.error().message());
      load_s.push_back(bench::now_seconds() - t);
      drop_cached_pages(saved);
      t = bench::now_seconds();
      if (auto ok = sync.load(saved); !ok)
        throw std::runtime_error(ok.error().message());
      cold_load_s.push_back(bench::now_seconds() - t);

      // The asynchronous save: what the loop waits for, then the write's end.
      t = bench::now_seconds();
      if (auto ok = async.save(++at); !ok)
        throw std::runtime_error(ok.error().message());
      block_s.push_back(bench::now_seconds() - t);
      if (auto ok = async.wait(); !ok)
        throw std::runtime_error(ok.error().message());
      async_total_s.push_back(bench::now_seconds() - t);

      const auto after = disk_rate(s.dir, bytes);
      disk_write_s.push_back((before.write + after.write) / 2);
      disk_read_s.push_back((before.warm_read + after.warm_read) / 2);
      disk_cold_read_s.push_back((before.cold_read + after.cold_read) / 2);
      if (!no_peers)
        if (auto peer = torch_peer(s, out)) {
          torch_save_s.push_back(peer->save);
          torch_load_s.push_back(peer->warm_load);
          torch_cold_load_s.push_back(peer->cold_load);
        }
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    loaded_gb = gb;
    cold_load_seconds = bench::median(cold_load_s);
    out.note("{:.3f} GB of shards per checkpoint; median of {} rounds", gb, s.rounds);
    auto rate = [&](const std::vector<double>& seconds) { return gb / bench::median(seconds); };
    out.add({"save", "GB/s", rate(save_s), "GB/s", "disk write+fsync", rate(disk_write_s), ""});
    if (!torch_save_s.empty())
      out.add({"save", "GB/s", rate(save_s), "GB/s", "torch.save+fsync", rate(torch_save_s), ""});
    out.add({"load, page cache warm", "GB/s", rate(load_s), "GB/s", "cached read", rate(disk_read_s), ""});
    if (!torch_load_s.empty())
      out.add({"load, page cache warm", "GB/s", rate(load_s), "GB/s", "torch.load", rate(torch_load_s), ""});
    out.add({"load, page cache dropped", "GB/s", rate(cold_load_s), "GB/s", "disk read", rate(disk_cold_read_s), ""});
    if (!torch_cold_load_s.empty())
      out.add({"load, page cache dropped", "GB/s", rate(cold_load_s), "GB/s", "torch.load",
               rate(torch_cold_load_s), ""});
    out.add({"asynchronous save", "blocked s", bench::median(block_s), "s", "synchronous save",
             bench::median(save_s), fmt::format("written in {:.2f} s", bench::median(async_total_s))});
  }
  bench::release_ranks(children, *node);
  fs::remove_all(s.dir);
  if (!no_restart)
    restart_rows(out, loaded_gb, cold_load_seconds);
  out.print();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  return bench::child_or_parent(
    argc, argv, "checkpoint", "stage",
    [](int child_argc, char** child_argv) {
      const auto s = parse(child_argc, child_argv);
      return bench::run_child(child_argc, child_argv, [&](actors::node& node, std::uint32_t) {
        parallel::register_stage_factory(node, recipe(s));
        return std::string("DONE");
      });
    },
    parent);
}
