#pragma once
// Watches a node's stop: if it has not ended after `report_every`, says on
// stderr which phase it is in (and again each period). A stop that hangs
// is otherwise silent, and the process that runs it only looks stuck at
// its end (examples.ssh_cluster_4_hosts once ran past the launcher's
// timeout after training, with nothing to say where).
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/core.h>

namespace troupe::actors {

class stop_watch {
public:
  stop_watch(std::string node, std::chrono::milliseconds report_every)
      : node_(std::move(node)), report_every_(report_every), watcher_([this] { watch(); }) {}

  ~stop_watch() {
    {
      std::lock_guard guard(mutex_);
      ended_ = true;
    }
    changed_.notify_all();
    watcher_.join();
  }

  stop_watch(const stop_watch&) = delete;
  stop_watch& operator=(const stop_watch&) = delete;

  /// What the stop does now ("closing the data plane"); a string literal.
  void phase(const char* what) {
    std::lock_guard guard(mutex_);
    phase_ = what;
  }

private:
  void watch() {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mutex_);
    while (!changed_.wait_for(lock, report_every_, [this] { return ended_; })) {
      const auto seconds =
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start).count();
      fmt::print(stderr, "troupe node {}: stopping for {} s, still {}\n", node_, seconds, phase_);
    }
  }

  std::string node_;
  std::chrono::milliseconds report_every_;
  std::mutex mutex_;
  std::condition_variable changed_;
  const char* phase_ = "starting to stop";
  bool ended_ = false;
  std::thread watcher_; // last: it reads the members above
};

} // namespace troupe::actors
