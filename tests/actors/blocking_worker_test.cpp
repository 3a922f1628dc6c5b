// The router's staging thread (actors/src/blocking_worker.hpp): jobs run
// one at a time, in the order posted, on one thread that is not the
// poster's; destroying it runs what was posted first, and one of its own
// jobs may destroy it.
#include "blocking_worker.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

TEST(BlockingWorker, RunsJobsInTheOrderPostedOnOneThreadOfItsOwn) {
  std::mutex mutex;
  std::vector<int> order;
  std::set<std::thread::id> threads;
  std::promise<void> go;
  auto started = go.get_future().share();
  {
    blocking_worker worker;
    // The first job blocks, as a wait for a device's copy does: the posts
    // behind it return at once and their jobs wait their turn.
    worker.post([&, started] {
      started.wait();
      std::lock_guard guard(mutex);
      order.push_back(0);
      threads.insert(std::this_thread::get_id());
    });
    for (int i = 1; i < 50; ++i)
      worker.post([&, i] {
        std::lock_guard guard(mutex);
        order.push_back(i);
        threads.insert(std::this_thread::get_id());
      });
    {
      std::lock_guard guard(mutex);
      EXPECT_TRUE(order.empty()) << "a job ran before the one posted before it finished";
    }
    go.set_value();
  } // destroyed: runs what was posted, then joins
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_NE(*threads.begin(), std::this_thread::get_id());
}

TEST(BlockingWorker, AJobMayPostAnother) {
  std::promise<int> done;
  {
    blocking_worker worker;
    worker.post([&] { worker.post([&] { done.set_value(7); }); });
  }
  auto value = done.get_future();
  ASSERT_EQ(value.wait_for(0s), std::future_status::ready) << "the job posted by a job was dropped";
  EXPECT_EQ(value.get(), 7);
}

// A completion run by a job may drop the last owner of the router, and
// with it the worker: that must not join the thread from itself (which
// throws, ending the process).
TEST(BlockingWorker, MayBeDestroyedByOneOfItsJobs) {
  auto worker = std::make_unique<blocking_worker>();
  std::promise<void> destroyed;
  worker->post([&] {
    worker.reset();
    destroyed.set_value();
  });
  EXPECT_EQ(destroyed.get_future().wait_for(10s), std::future_status::ready);
}

TEST(BlockingWorker, ANeverUsedWorkerIsDestroyedAtOnce) {
  const auto begin = std::chrono::steady_clock::now();
  { blocking_worker worker; }
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 1s);
}

} // namespace
} // namespace troupe::actors
