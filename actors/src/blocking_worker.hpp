#pragma once
// A thread of its own for work that blocks, so that an actor's thread never
// does: the tensor router waits here for device tensors' copies to the host
// while its actor goes on routing other nodes' sends. Jobs run one at a
// time, in the order posted; the thread starts with the first job, so a
// process that never posts has none.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::actors {

class blocking_worker {
public:
  blocking_worker() = default;
  /// Runs every job already posted, then joins the thread.
  ~blocking_worker();
  blocking_worker(const blocking_worker&) = delete;
  blocking_worker& operator=(const blocking_worker&) = delete;

  /// Queues `job` behind those posted before it. Any thread.
  void post(std::function<void()> job);

private:
  void run();

  std::mutex mutex_;
  std::condition_variable posted_;
  std::deque<std::function<void()>> jobs_;
  bool closing_ = false;
  std::thread thread_; // started by the first post
};

} // namespace troupe::actors
