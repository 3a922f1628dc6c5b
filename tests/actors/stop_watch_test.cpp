// The node's stop watch (actors/src/stop_watch.hpp): a stop that takes
// longer than its period is reported on stderr, naming the phase it is in;
// a quick stop says nothing.
#include "stop_watch.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

TEST(StopWatch, ASlowPhaseIsReportedByName) {
  testing::internal::CaptureStderr();
  {
    stop_watch watch("worker3", 50ms);
    watch.phase("closing the data plane");
    std::this_thread::sleep_for(20ms);
    watch.phase("in the actor system's shutdown");
    std::this_thread::sleep_for(200ms);
  }
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("troupe node worker3: stopping for 0 s, still in the actor system's shutdown"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("closing the data plane"), std::string::npos) << said;
}

TEST(StopWatch, AQuickStopSaysNothing) {
  testing::internal::CaptureStderr();
  {
    stop_watch watch("worker3", 10s);
    watch.phase("leaving the registry");
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

} // namespace
} // namespace troupe::actors
