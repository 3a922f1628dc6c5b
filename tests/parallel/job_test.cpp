// The job (troupe/job.hpp): strict flags reported before anything listens,
// ranks that learn each other's node names whatever they are called, and a
// lifecycle that ends without hanging — serving ranks released by the
// driver, distributed objects still in scope stopped by finish(), a serving
// rank ending with 1 when the driver's process dies, a node's stop that
// hangs ended within its bound. The other rank runs as a child process (this
// binary, `--job-child <mode>`).
#include "troupe/job.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include <caf/blocking_actor.hpp>

#include "../actors/process_support.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/ring_allreduce.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using ::testing::HasSubstr;
using troupe::test::child_process;
using troupe::test::rank_flags;

namespace {

/// argv for a job: the program name, then `args`.
struct command_line {
  explicit command_line(std::vector<std::string> args) : strings(std::move(args)) {
    strings.insert(strings.begin(), "job_test");
    for (auto& s : strings)
      pointers.push_back(s.data());
  }
  int argc() { return static_cast<int>(pointers.size()); }
  char** argv() { return pointers.data(); }
  std::vector<std::string> strings;
  std::vector<char*> pointers;
};

std::shared_ptr<nn::sequential> make_mlp() {
  auto model = std::make_shared<nn::sequential>();
  for (int i = 0; i < 2; ++i)
    model->append(nn::make<nn::linear>(nn::linear_options{.in_features = 8, .out_features = 8, .type = dtype::float64}));
  model->reset_parameters(3);
  return model;
}

parallel::stage_recipe recipe() {
  return {make_mlp, parallel::sgd_factory({.lr = 0.05}), parallel::mse_loss_function()};
}

TEST(Job, BadFlagsAreOneUsageErrorBeforeAnythingListens) {
  command_line cl({"--steps=0", "--schedule=zigzag", "--stpes=3", "--troupe.rank=0"});
  job j(cl.argc(), cl.argv());
  EXPECT_EQ(j.flag("steps", 5, 1, 100), 5) << "a bad value reads as the fallback until start() reports it";
  EXPECT_EQ(j.flag("schedule", "1f1b", {"1f1b", "gpipe"}), "1f1b");
  auto started = j.try_start();
  ASSERT_FALSE(started);
  EXPECT_EQ(started.error().code(), errc::invalid_argument);
  EXPECT_THAT(started.error().message(), HasSubstr("--steps is '0' but must be an integer in [1, 100]"));
  EXPECT_THAT(started.error().message(), HasSubstr("--schedule is 'zigzag' but must be one of 1f1b, gpipe"));
  EXPECT_THAT(started.error().message(), HasSubstr("unknown argument '--stpes=3'"));
  EXPECT_THROW((void)j.rank(), usage_error) << "nothing started";
}

TEST(Job, GoodFlagsAreRead) {
  command_line cl({"--steps=7", "--schedule=gpipe"});
  job j(cl.argc(), cl.argv());
  EXPECT_EQ(j.flag("steps", 5, 1, 100), 7);
  EXPECT_EQ(j.flag("schedule", "1f1b", {"1f1b", "gpipe"}), "gpipe");
  EXPECT_EQ(j.flag("absent", 3, 1, 9), 3);
}

/// Sockets this process holds (file descriptors that are sockets).
std::size_t open_sockets() {
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(entry.path(), ec);
    if (!ec && target.string().starts_with("socket:"))
      ++n;
  }
  return n;
}

TEST(LocalJob, OneProcessThatOpensNoSocketAndRunsAPipelineInIt) {
  const auto sockets_before = open_sockets();
  auto local = job::local("solo");
  ASSERT_TRUE(local) << local.error().message();
  EXPECT_EQ(open_sockets(), sockets_before) << "a local job listens nowhere and starts no data plane";
  EXPECT_TRUE(local->is_driver());
  EXPECT_EQ(local->world_size(), 1u);
  EXPECT_EQ(local->places(), (std::vector<std::string>{"solo/cpu"}));
  auto model = make_mlp();
  auto pipe = parallel::pipeline::create(*local, {.model = model, .split = parallel::even(2, model->size()),
                                                  .micro_batches = 2, .optimizer = parallel::sgd_factory({.lr = 0.05}),
                                                  .loss = parallel::mse_loss_function(), .in_this_process = true});
  ASSERT_TRUE(pipe) << pipe.error().message();
  EXPECT_EQ(pipe->stages(), 2u);
  EXPECT_EQ(pipe->stage_name(1), "solo/cpu/stage1");
  generator gen{4};
  auto x = randn({4, 8}, gen, 0.0, 1.0, dtype::float64);
  auto first = pipe->train_step(x, x);
  auto second = pipe->train_step(x, x);
  ASSERT_TRUE(first && second);
  EXPECT_LT(*second, *first);
  EXPECT_EQ(local->finish(0), 0) << "finish stops the pipeline still in scope";
  auto after = pipe->train_step(x, x);
  ASSERT_FALSE(after);
  EXPECT_THAT(after.error().message(), HasSubstr("its job has finished"));
}

TEST(LocalJob, MovesWhileObjectsMadeFromItLiveAndStillStopsThemAtFinish) {
  auto local = job::local("solo");
  ASSERT_TRUE(local) << local.error().message();
  // Two members of one ring in this process, joined from the job.
  const std::vector<std::string> places{"solo/cpu/reducer0", "solo/cpu/reducer1"};
  std::vector<std::optional<parallel::reducer_group>> groups(2);
  std::vector<std::thread> joins;
  for (std::uint32_t r = 0; r < 2; ++r)
    joins.emplace_back([&, r] {
      auto g = parallel::reducer_group::join(*local, {.rank = r, .places = places, .timeout = 5000ms});
      if (g)
        groups[r].emplace(std::move(*g));
      else
        ADD_FAILURE() << g.error().message();
    });
  for (auto& t : joins)
    t.join();
  ASSERT_TRUE(groups[0] && groups[1]);
  auto data = tensor::ones({4}, dtype::float32);
  auto other = std::async(std::launch::async, [&] { return parallel::ring_allreduce(*groups[1], tensor::ones({4})); });
  ASSERT_TRUE(parallel::ring_allreduce(*groups[0], data));
  ASSERT_TRUE(other.get());
  EXPECT_EQ(data.to_vector<float>(), std::vector<float>(4, 2.0f));

  job moved = std::move(*local); // the groups hold no reference to the job object
  EXPECT_EQ(moved.finish(0), 0);
  auto after = parallel::ring_allreduce(*groups[0], data);
  ASSERT_FALSE(after) << "finish() took rank 0 out of the ring";
  EXPECT_THAT(after.error().message(), HasSubstr("has left the ring"));
  groups.clear(); // after the job finished and moved: nothing to forget, no crash
}

/// Rank `rank` of 2 as a child process running `mode` (see main).
child_process start_child(const std::string& mode, std::uint32_t rank, const std::string& name, std::uint16_t port) {
  std::vector<std::string> args{"--job-child", mode};
  for (auto& f : rank_flags(rank, name, port))
    args.push_back(f);
  return child_process::start(child_process::self_path(), args,
                              {"TROUPE_COORDINATOR=", "TROUPE_RANK=", "TROUPE_WORLD_SIZE=", "TROUPE_NODE_NAME=",
                               "TROUPE_TRACE_DIR="});
}

/// A data-parallel replica from the job: three steps, then whether the
/// replicas are identical ("identical"), finishing with its objects in scope.
std::string train_replica(job& j) {
  auto model = make_mlp();
  auto dp = parallel::data_parallel::create(j, model->named_parameters());
  if (!dp)
    return dp.error().message();
  auto opt = parallel::sgd_factory({.lr = 0.05})(model->named_parameters());
  generator gen{10 + j.rank()};
  for (int step = 0; step < 3; ++step) {
    opt->zero_grad();
    auto x = randn({4, 8}, gen, 0.0, 1.0, dtype::float64);
    auto loss = parallel::mse_loss_function()((*model)(autograd::variable(x)), tensor::zeros({4, 8}, dtype::float64));
    if (auto ok = dp->backward(loss); !ok)
      return ok.error().message();
    opt->step();
  }
  auto same = dp->replicas_identical();
  std::string verdict = !same ? same.error().message() : (*same ? "identical" : "different");
  j.finish(0);
  return verdict;
}

// Rank 1 serves; the driver makes a pipeline over both ranks from the job
// alone (places and recipe), trains, and finishes with the pipeline still
// in scope: finish() stops it, releases rank 1, and nothing hangs.
TEST(Job, RanksWithAnyNamesKnowEachOtherAndEndCleanly) {
  const auto port = test::unused_port();
  auto server = start_child("serve", 1, "beta", port);
  command_line cl(rank_flags(0, "alpha", port));
  job driver(cl.argc(), cl.argv());
  driver.host_stages(recipe());
  auto started = driver.try_start();
  ASSERT_TRUE(started) << started.error().message() << server.output();
  EXPECT_TRUE(driver.is_driver());
  EXPECT_EQ(driver.world_size(), 2u);
  EXPECT_EQ(driver.places(), (std::vector<std::string>{"alpha/cpu", "beta/cpu"}));
  EXPECT_EQ(driver.places("cuda:0"), (std::vector<std::string>{"alpha/cuda:0", "beta/cuda:0"}));
  EXPECT_TRUE(server.wait_for("places alpha/cpu beta/cpu", 20s)) << "every rank knows every name: " << server.output();

  auto pipe = parallel::pipeline::create(driver, {.micro_batches = 2});
  ASSERT_TRUE(pipe) << pipe.error().message();
  generator gen{4};
  auto x = randn({4, 8}, gen, 0.0, 1.0, dtype::float64);
  auto y = randn({4, 8}, gen, 0.0, 1.0, dtype::float64);
  auto first = pipe->train_step(x, y);
  ASSERT_TRUE(first) << first.error().message();
  // The driver built the recipe's model for its own stage with only that
  // stage's values drawn (nn::deferred_init); rank 1 built its own. The
  // first loss is the whole model's, built here in one piece.
  auto whole = recipe().model();
  const double one_process = autograd::mse_loss((*whole)(autograd::variable(x)), autograd::variable(y)).data().item();
  EXPECT_NEAR(*first, one_process, 1e-12);
  auto second = pipe->train_step(x, y);
  ASSERT_TRUE(second) << second.error().message();
  EXPECT_LT(*second, *first) << "the job's recipe trains";
  {
    // The same recipe with both stages in the driver's process: each draws
    // its own layers of the model built for it.
    auto solo = parallel::pipeline::create(driver, {.split = parallel::even(2, 2), .micro_batches = 2,
                                                    .in_this_process = true, .name = "solo"});
    ASSERT_TRUE(solo) << solo.error().message();
    auto solo_first = solo->train_step(x, y);
    ASSERT_TRUE(solo_first) << solo_first.error().message();
    EXPECT_NEAR(*solo_first, one_process, 1e-12);
  }

  const auto before = std::chrono::steady_clock::now();
  EXPECT_EQ(driver.finish(3), 3);
  auto status = server.exited(20s);
  ASSERT_TRUE(status) << "the serving rank was released: " << server.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << server.output();
  EXPECT_LT(test::seconds_since(before), 20.0);
  auto after = pipe->train_step(x, y);
  ASSERT_FALSE(after);
  EXPECT_THAT(after.error().message(), HasSubstr("its job has finished"));
}

// Both ranks train as replicas (data parallel from the job) and finish with
// their objects in scope; the replicas are identical and nothing hangs.
TEST(Job, DataParallelReplicasFromTheJobFinishInScope) {
  const auto port = test::unused_port();
  auto other = start_child("replica", 1, "gamma", port);
  command_line cl(rank_flags(0, "delta", port));
  job j(cl.argc(), cl.argv());
  auto started = j.try_start();
  ASSERT_TRUE(started) << started.error().message() << other.output();
  EXPECT_EQ(train_replica(j), "identical");
  auto status = other.exited(20s);
  ASSERT_TRUE(status) << other.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << other.output();
  EXPECT_THAT(other.output(), HasSubstr("replica identical"));
}

// The driver's process dies (SIGKILL) while rank 1 serves: serve() returns
// 1 once the loss is detected and the serving process ends with it, instead
// of waiting for a release forever. Both ranks are child processes (a
// serving rank whose driver died leaves its node to the operating system).
TEST(Job, AServingRankEndsWithOneWhenTheDriverDies) {
  const auto port = test::unused_port();
  auto driver = start_child("drive-and-hang", 0, "epsilon", port);
  auto server = start_child("serve", 1, "zeta", port);
  ASSERT_TRUE(driver.wait_for("started", 20s)) << driver.output();
  ASSERT_TRUE(server.wait_for("places epsilon/cpu zeta/cpu", 20s)) << server.output();
  const auto killed = std::chrono::steady_clock::now();
  driver.signal(SIGKILL);
  auto status = server.exited(30s);
  ASSERT_TRUE(status) << "the serving rank must end: " << server.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << server.output();
  EXPECT_LT(test::seconds_since(killed), 30.0);
}

/// The child side: `--job-child <mode> <job flags>`.
int run_child(int argc, char** argv) {
  const std::string mode = argv[2];
  std::vector<char*> rest{argv[0]};
  for (int i = 3; i < argc; ++i)
    rest.push_back(argv[i]);
  job j(static_cast<int>(rest.size()), rest.data());
  if (mode == "serve")
    j.host_stages(recipe());
  if (auto ok = j.try_start(); !ok) {
    std::printf("start failed: %s\n", ok.error().message().c_str());
    return 1;
  }
  if (mode == "serve") {
    std::printf("places %s %s\n", j.places()[0].c_str(), j.places()[1].c_str());
    std::fflush(stdout);
    return j.serve();
  }
  if (mode == "replica") {
    auto verdict = train_replica(j);
    std::printf("replica %s\n", verdict.c_str());
    return verdict == "identical" ? 0 : 1;
  }
  std::printf("started\n"); // drive-and-hang: the test kills this process
  std::fflush(stdout);
  std::this_thread::sleep_for(60s);
  return 1;
}

} // namespace

/// In a death test's child: a local job beside an actor that never stops
/// (CAF's shutdown waits for it forever), then finish(status). finish must
/// not return; the bound on the node's stop ends the process with `status`.
[[noreturn]] void finish_beside_an_actor_that_never_stops(int status) {
  auto local = job::local("solo");
  if (!local)
    std::_Exit(90);
  local->node().system().spawn([](caf::blocking_actor*) { std::this_thread::sleep_for(1h); });
  local->finish(status);
  std::_Exit(91); // the stop returned although an actor still runs
}

// Both within the bound of 60 s, so each takes a minute.
TEST(LocalJobDeathTest, AnOrderlyEndWhoseStopHangsEndsTheProcessWithItsStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(finish_beside_an_actor_that_never_stops(0), ::testing::ExitedWithCode(0),
              "solo: the node did not stop within 60000 ms of the job's end; ending the process with status 0");
}

TEST(LocalJobDeathTest, AFailingDriverWhoseStopHangsEndsTheProcessWithItsStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(finish_beside_an_actor_that_never_stops(3), ::testing::ExitedWithCode(3),
              "solo: the node did not stop within 60000 ms of the job's end; ending the process with status 3");
}

int main(int argc, char** argv) {
  if (argc > 2 && std::string_view(argv[1]) == "--job-child")
    return run_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
