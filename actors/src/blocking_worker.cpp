#include "blocking_worker.hpp"

#include <utility>

namespace troupe::actors {

blocking_worker::~blocking_worker() {
  {
    std::lock_guard guard(mutex_);
    closing_ = true;
  }
  posted_.notify_one();
  if (thread_.joinable())
    thread_.join();
}

void blocking_worker::post(std::function<void()> job) {
  {
    std::lock_guard guard(mutex_);
    jobs_.push_back(std::move(job));
    if (!thread_.joinable())
      thread_ = std::thread([this] { run(); });
  }
  posted_.notify_one();
}

void blocking_worker::run() {
  std::unique_lock guard(mutex_);
  while (true) {
    posted_.wait(guard, [this] { return closing_ || !jobs_.empty(); });
    if (jobs_.empty())
      return; // closing, and nothing left
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    guard.unlock();
    job();
    guard.lock();
  }
}

} // namespace troupe::actors
