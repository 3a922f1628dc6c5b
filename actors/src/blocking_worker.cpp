#include "blocking_worker.hpp"

#include <utility>

namespace troupe::actors {

blocking_worker::blocking_worker() : queue_(std::make_shared<queue>()) {}

blocking_worker::~blocking_worker() {
  std::thread thread;
  {
    std::lock_guard guard(queue_->mutex);
    queue_->closing = true;
    thread = std::move(thread_);
  }
  queue_->posted.notify_one();
  if (!thread.joinable())
    return;
  if (thread.get_id() == std::this_thread::get_id())
    thread.detach(); // a job of its own destroys it: the thread ends after its jobs
  else
    thread.join();
}

void blocking_worker::post(std::function<void()> job) {
  {
    std::lock_guard guard(queue_->mutex);
    queue_->jobs.push_back(std::move(job));
    if (!queue_->started) {
      queue_->started = true;
      thread_ = std::thread([state = queue_] { run(*state); });
    }
  }
  queue_->posted.notify_one();
}

void blocking_worker::run(queue& jobs) {
  std::unique_lock guard(jobs.mutex);
  while (true) {
    jobs.posted.wait(guard, [&jobs] { return jobs.closing || !jobs.jobs.empty(); });
    if (jobs.jobs.empty())
      return; // closing, and nothing left
    auto job = std::move(jobs.jobs.front());
    jobs.jobs.pop_front();
    guard.unlock();
    job();
    guard.lock();
  }
}

} // namespace troupe::actors
