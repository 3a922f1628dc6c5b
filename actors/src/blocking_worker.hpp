#pragma once
// A thread of its own for work that blocks, so that an actor's thread never
// does: the tensor router waits here for device tensors' copies to the host
// while its actor goes on routing other nodes' sends. Jobs run one at a
// time, in the order posted; the thread starts with the first job, so a
// process that never posts has none.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace troupe::actors {

class blocking_worker {
public:
  blocking_worker();
  /// Runs every job already posted, then joins the thread. Destroyed by one
  /// of its own jobs (a completion that drops the last owner), it lets the
  /// thread finish those jobs and end by itself instead.
  ~blocking_worker();
  blocking_worker(const blocking_worker&) = delete;
  blocking_worker& operator=(const blocking_worker&) = delete;

  /// Queues `job` behind those posted before it. Any thread.
  void post(std::function<void()> job);

private:
  /// What the thread uses: kept alive by the thread itself, so that it may
  /// outlive the worker.
  struct queue {
    std::mutex mutex;
    std::condition_variable posted;
    std::deque<std::function<void()>> jobs;
    bool closing = false;
    bool started = false; // once: a job posted while closing runs on the same thread
  };
  static void run(queue& jobs);

  std::shared_ptr<queue> queue_;
  std::thread thread_; // started by the first post, under queue_->mutex; moved out by the destructor
};

} // namespace troupe::actors
