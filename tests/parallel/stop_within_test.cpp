// The bound on a finished job's node stop (parallel/src/stop_within.hpp):
// a stop that hangs ends the process with the job's status and says so; a
// quick one returns and says nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "stop_within.hpp"

using namespace std::chrono_literals;
using troupe::parallel::stop_within;

TEST(StopWithinDeathTest, AStopThatHangsEndsTheProcessWithTheJobsStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(stop_within(300ms, "trainer", 7, [] { std::this_thread::sleep_for(1h); }),
              ::testing::ExitedWithCode(7),
              "trainer: the node did not stop within 300 ms of the job's end; ending the process with status 7");
}

TEST(StopWithin, AQuickStopReturnsAndSaysNothing) {
  bool ran = false;
  ::testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  stop_within(10s, "trainer", 7, [&] { ran = true; });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s); // the watchdog does not wait out its bound
  EXPECT_TRUE(ran);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}
