#pragma once
// One process of a troupe job: its command line, its node, its rank among
// the others, and its lifecycle. Every distributed program starts here.
//
// From examples/pipeline_demo.cpp:
//
//   job job(argc, argv);
//   const auto steps = job.flag("steps", 100, 1, 1'000'000);
//   ...
//   job.host_stages(corpus.recipe()); // every rank: the same model from the same seed
//   job.start();
//   if (!job.is_driver()) return job.serve();
//   ...
//   for (auto step : job.steps(steps, done)) {
//     auto [x, y] = corpus.batch(data, batch, seq);
//     step.report(job.must(pipe.train_step(x, y), fmt::format("step {}", step.number())), batch);
//   }
//   ...
//   return job.finish(0);
//
// The job reads the `--troupe.*` flags and TROUPE_* environment, start()
// joins the other ranks, serve() hosts stages on ranks > 0 until the driver
// is done, finish() releases every rank and stops the node.
//
// Flags are `--name=value`, each checked when read: a bad value or an
// argument nobody read is a usage error, reported by start() as
// "<program>: --steps is 'x' but must be an integer in [1, 1000000]" with
// exit code 2. A job that cannot start (no coordinator, TLS files missing)
// prints why and exits 1. try_start() returns those errors instead.
//
// Ranks: rank 0 drives. Ranks that only host actors for the driver call
// serve(), which returns 0 when the driver calls finish() (or its job object
// goes away) and 1 when the driver's process is lost. Ranks that run their
// own loop (data parallel) call finish() too. finish() never hangs: the
// objects made from the job stop first, each serving rank is told within a
// bounded time, then the node stops.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/actors/fwd.hpp"
#include "troupe/tensor/device.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {

namespace parallel {
struct stage_recipe;
class finish_hook;
}

class job {
public:
  /// One iteration of steps(): its number, from 1.
  class step {
  public:
    std::int64_t number() const { return number_; }
    operator std::int64_t() const { return number_; }
    /// On the driver, prints "step N  loss L  samples/s S<extra>" at the
    /// loop's first step, every --print-every=K steps (default 10) and the
    /// last; samples/s over the loop's steps so far, timed from its start.
    void report(double loss, std::int64_t samples_per_step, std::string_view extra = {}) const;

  private:
    friend class job;
    step(const job* owner, std::int64_t number, std::int64_t first, std::int64_t last,
         std::chrono::steady_clock::time_point start)
      : owner_(owner), number_(number), first_(first), last_(last), start_(start) {}
    const job* owner_;
    std::int64_t number_, first_, last_;
    std::chrono::steady_clock::time_point start_;
  };
  /// `for (auto step : job.steps(n))`: steps 1..n, timed from the loop's start.
  class step_range {
  public:
    struct iterator {
      const job* owner;
      std::int64_t number, first, last;
      std::chrono::steady_clock::time_point start;
      step operator*() const { return {owner, number, first, last, start}; }
      iterator& operator++() { ++number; return *this; }
      bool operator!=(const iterator& other) const { return number != other.number; }
    };
    iterator begin() const { return {owner_, first_, first_, count_, std::chrono::steady_clock::now()}; }
    iterator end() const { return {owner_, count_ + 1, first_, count_, {}}; }

  private:
    friend class job;
    step_range(const job* owner, std::int64_t count, std::int64_t done)
      : owner_(owner), count_(count), first_(std::min(done, count) + 1) {}
    const job* owner_;
    std::int64_t count_;
    std::int64_t first_;
  };

  /// Keeps the command line; nothing starts before start().
  job(int argc, char** argv);
  /// A started job of one process that opens no socket: node `node_name`,
  /// rank 0 of 1, no flags. For in-process pipelines, tests and tools;
  /// `job.places()` names its one place. Errors: the node could not start.
  static expected<job> local(std::string node_name = "worker0");
  /// finish(0) if the driver has not finished; a serving rank stops its node.
  ~job();
  job(job&&) noexcept;
  job& operator=(job&&) noexcept;
  job(const job&) = delete;
  job& operator=(const job&) = delete;

  /// `--name=value` as an integer in [low, high]; `fallback` when absent.
  std::int64_t flag(std::string_view name, std::int64_t fallback, std::int64_t low, std::int64_t high);
  /// `--name=value` as one of `allowed`; `fallback` when absent.
  std::string flag(std::string_view name, std::string fallback, const std::vector<std::string>& allowed);
  /// `--name=value` as free text (a path); `fallback` when absent.
  std::string flag(std::string_view name, std::string fallback);
  /// `--name=cpu` or `--name=cuda:N`, a device this rank's machine has;
  /// `fallback` when absent. Its to_string() names every rank's place on
  /// it: `job.places(where.to_string())`.
  device flag(std::string_view name, device fallback);
  /// Records a usage error of the program's own (a flag that depends on
  /// another); start() reports it like a bad flag.
  void reject(std::string message);

  /// This process may host pipeline stages built from `recipe` (the same on
  /// every rank). Call before start().
  void host_stages(const parallel::stage_recipe& recipe);

  /// Checks the flags, starts the node and joins the job; the driver also
  /// waits until every rank is ready. Prints the error and exits the
  /// process with 2 (usage) or 1 (runtime) when that fails.
  void start();
  /// start() returning the error instead (invalid_argument: usage).
  expected<void> try_start();

  std::uint32_t rank() const;
  std::uint32_t world_size() const;
  /// Which run of the job this is: 0 the first, k after `troupe-launch
  /// --restarts` started the job again k times (TROUPE_RESTART). A job
  /// restarted after a failure resumes from its latest checkpoint.
  std::uint32_t restart() const;
  bool is_driver() const { return rank() == 0; }
  /// Every rank's node name, by rank.
  const std::vector<std::string>& nodes() const;
  /// Every rank's "<node>/<device>" place, by rank.
  std::vector<std::string> places(std::string_view device = "cpu") const;
  /// This process's node (for what the job does not wrap yet).
  actors::node& node();
  /// The recipe given to host_stages (usage_error without one).
  const parallel::stage_recipe& stages() const;
  /// The program name from argv[0], for messages.
  const std::string& program() const;

  /// Steps done+1..count for a training loop, each with report(): a run
  /// resumed from the checkpoint of step `done` (checkpoints::resume)
  /// goes on after it.
  step_range steps(std::int64_t count, std::int64_t done = 0) const { return {this, count, done}; }

  /// Ranks other than the driver: hosts actors until the driver finishes
  /// (0) or its process is lost (1), then stops the node. finish(0).
  int serve();
  /// Ends this rank's part: stops the distributed objects made from the job
  /// that are still alive, newest first. The driver then releases every other
  /// rank, each once it has reached its own finish() (at most a minute; a
  /// rank whose process is lost is not waited for, and a driver finishing
  /// with a non-zero status waits for none), and stops its node; the other
  /// ranks wait for that release (so
  /// the driver's node outlives their last collective) or the driver's
  /// loss. Returns `status`, or 1 when the driver was lost; in that case
  /// the node is left to the process's exit. Idempotent; the destructor
  /// calls it.
  int finish(int status);

  /// The value of `result`; on an error prints "<program>: <context>:
  /// <message>", finishes the job and exits the process with 1. For a main
  /// program's setup and steps; handle the expected yourself to recover.
  template <class T> T must(expected<T> result, std::string_view context = {}) {
    if (!result)
      fail(result.error(), context);
    return std::move(*result);
  }
  void must(expected<void> result, std::string_view context = {}) {
    if (!result)
      fail(result.error(), context);
  }
  /// Prints the error as must() does, finishes the job and exits with 1.
  [[noreturn]] void fail(const error& why, std::string_view context = {});

private:
  friend class parallel::finish_hook; // the distributed objects' stops at finish()
  /// start()'s work after the flags: the node, the factories, every rank.
  expected<void> join(const actors::node_options& options);
  struct state;
  std::unique_ptr<state> state_;
};

} // namespace troupe
