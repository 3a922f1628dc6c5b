#include "stop_within.hpp"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace troupe::parallel {

void stop_within(std::chrono::milliseconds bound, const std::string& program, int status,
                 const std::function<void()>& stop) {
  std::mutex mutex;
  std::condition_variable changed;
  bool stopped = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (changed.wait_for(lock, bound, [&] { return stopped; }))
      return;
    std::fflush(stdout);
    fmt::print(stderr, "{}: the node did not stop within {} ms of the job's end; ending the process with status {}\n",
               program, bound.count(), status);
    std::fflush(stderr);
    std::_Exit(status);
  });
  stop();
  {
    std::lock_guard guard(mutex);
    stopped = true;
  }
  changed.notify_all();
  watchdog.join();
}

} // namespace troupe::parallel
