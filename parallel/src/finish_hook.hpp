#pragma once
// What the job stops when it finishes. Every distributed object made from
// a job (a pipeline, a reducer group, parameter servers and clients, remote
// modules) holds a finish_hook: job::finish() runs the objects' stops,
// newest first, unless an object was destroyed first (its hook forgets
// itself). The hook holds the job's list weakly, so either may outlive the
// other and the job may move.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace troupe {
class job;
}

namespace troupe::parallel {

/// The job's list of stops (job::state holds it).
class finish_hooks {
public:
  std::uint64_t add(std::function<void()> stop);
  void forget(std::uint64_t id);
  /// Runs and removes every stop, newest first (a data-parallel wrapper
  /// before its reducer group); stops added meanwhile run too.
  void run_all();

private:
  std::mutex mutex_;
  std::vector<std::pair<std::uint64_t, std::function<void()>>> stops_;
  std::uint64_t next_ = 1;
};

class finish_hook {
public:
  finish_hook() = default;
  /// `stop` runs at job.finish() unless this hook is destroyed or forgotten
  /// first. It must not capture anything that dies before the hook.
  finish_hook(troupe::job& job, std::function<void()> stop);
  ~finish_hook() { forget(); }
  finish_hook(finish_hook&& other) noexcept
      : hooks_(std::move(other.hooks_)), id_(std::exchange(other.id_, 0)) {}
  finish_hook& operator=(finish_hook&& other) noexcept {
    if (this != &other) {
      forget();
      hooks_ = std::move(other.hooks_);
      id_ = std::exchange(other.id_, 0);
    }
    return *this;
  }
  finish_hook(const finish_hook&) = delete;
  finish_hook& operator=(const finish_hook&) = delete;

  void forget() noexcept {
    if (auto hooks = hooks_.lock(); hooks && id_ != 0)
      hooks->forget(id_);
    hooks_.reset();
    id_ = 0;
  }

private:
  std::weak_ptr<finish_hooks> hooks_;
  std::uint64_t id_ = 0;
};

/// For the shared state behind a movable handle (a parameter server or
/// client, a remote module or its host), which holds `finish_hook
/// at_finish` and an idempotent `stop()`: the job's finish() stops it.
template <class State> void stop_at_finish(troupe::job& job, State& state) {
  state.at_finish = finish_hook(job, [&state] { state.stop(); });
}

/// What such a handle's destructor and move assignment do with the state
/// it holds (nothing for a moved-from handle).
template <class State> void stop_now(const std::shared_ptr<State>& state) {
  if (state) {
    state->at_finish.forget();
    state->stop();
  }
}

/// Such a handle's move assignment: stops the state it held, takes the other's.
template <class State> void take_state(std::shared_ptr<State>& mine, std::shared_ptr<State>& theirs) {
  if (&mine != &theirs) {
    stop_now(mine);
    mine = std::move(theirs);
  }
}

} // namespace troupe::parallel
