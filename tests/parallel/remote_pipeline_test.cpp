// Pipelines across processes: this test binary is worker0 (driver, and some
// stages) and re-executes itself as worker1 (the other stages). Stages are
// spawned through node::spawn_remote by the "troupe.pipeline_stage" factory,
// each process builds the same model from the same seed, and activations and
// gradients travel through the tensor routers (UCX data plane).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <caf/all.hpp>

#include "ring_support.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::parallel;
using troupe::test::child_process;
using ::testing::HasSubstr;

namespace {

std::shared_ptr<nn::sequential> make_mlp() {
  auto model = std::make_shared<nn::sequential>();
  for (int i = 0; i < 8; ++i) {
    nn::linear_options o;
    o.in_features = 32;
    o.out_features = 32;
    o.type = dtype::float64;
    model->append(nn::make<nn::linear>(o));
    model->append(nn::make<nn::relu>());
  }
  model->reset_parameters(7);
  return model;
}

stage_recipe recipe() {
  return {make_mlp, sgd_factory({.lr = 0.05, .momentum = 0.9}), mse_loss_function()};
}

bool is_stage_child(int argc, char** argv) {
  return argc > 1 && std::string_view(argv[1]) == "--stage-child";
}

/// worker1: a node with the stage factory, until stdin closes.
int run_stage_child(int argc, char** argv) {
  return troupe::test::serve_as_child_node(argc, argv, [](actors::node& node) {
    register_stage_factory(node, recipe());
    return std::function<void()>{};
  });
}

/// worker0 here with the stage factory, worker1 a child process.
void start_cluster(troupe::test::cluster& c) {
  ASSERT_NO_FATAL_FAILURE(troupe::test::start_cluster(c, 2, "--stage-child"));
  register_stage_factory(*c.coordinator, recipe());
  ASSERT_TRUE(c.workers[0].wait_for("READY", 15s)) << c.workers[0].output();
}

struct batch {
  tensor inputs;
  tensor targets;
};

batch make_batch(std::uint64_t step) {
  generator gen{1000 + step};
  return {randn({12, 32}, gen, 0.0, 1.0, dtype::float64),
          randn({12, 32}, gen, 0.0, 1.0, dtype::float64)};
}

double digest(const nn::module& layers) {
  double sum = 0;
  for (const auto& p : layers.parameters())
    for (double v : p.data().to_vector<double>())
      sum += v + v * v;
  return sum;
}

/// True once every thread of `pid` is in the stopped state ('T').
bool all_threads_stopped(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto tasks = std::filesystem::path("/proc") / std::to_string(pid) / "task";
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      auto close = line.rfind(')');
      if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T')
        all = false;
    }
    if (all && !ec)
      return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

struct remote_case {
  schedule_kind schedule;
  std::vector<std::string> places;
  std::size_t micro_batches;
  bool overlap_update = false;
};

void PrintTo(const remote_case& c, std::ostream* os) {
  *os << name_of(c.schedule) << " over " << c.places.size() << " stages, " << c.micro_batches
      << " micro-batches" << (c.overlap_update ? ", updates overlapping the next step" : "");
}

class RemotePipeline : public ::testing::TestWithParam<remote_case> {};

TEST_P(RemotePipeline, SameLossesAndParametersAsOneProcess) {
  const auto& c = GetParam();
  troupe::test::cluster cl;
  ASSERT_NO_FATAL_FAILURE(start_cluster(cl));
  auto options = pipeline_options_from(recipe());
  options.places = c.places;
  options.split = even(c.places.size(), options.model->size());
  options.schedule = c.schedule;
  options.micro_batches = c.micro_batches;
  options.overlap_update = c.overlap_update;
  options.timeout = 20s;
  auto split = options.split;
  auto pipe = pipeline::create(*cl.coordinator, std::move(options));
  ASSERT_TRUE(pipe.has_value()) << pipe.error_value().message() << "\n" << cl.workers[0].output();

  auto reference = make_mlp();
  optim::sgd reference_opt(reference->named_parameters(), {.lr = 0.05, .momentum = 0.9});
  for (std::uint64_t step = 0; step < 3; ++step) {
    auto b = make_batch(step);
    auto loss = autograd::mse_loss(reference->forward(autograd::variable(b.inputs)),
                                   autograd::variable(b.targets));
    autograd::backward(loss);
    reference_opt.step();
    reference_opt.zero_grad();
    auto got = pipe->train_step(b.inputs, b.targets);
    ASSERT_TRUE(got.has_value()) << got.error_value().message() << "\n" << cl.workers[0].output();
    EXPECT_NEAR(*got, loss.item(), 1e-12) << "step " << step;
  }
  // Parameters stay in their processes; compare digests per stage.
  auto digests = pipe->parameter_digests();
  ASSERT_TRUE(digests.has_value()) << digests.error_value().message();
  for (std::size_t s = 0; s < split.stages(); ++s) {
    double want = digest(*reference->slice(split.begin(s), split.end(s)));
    EXPECT_NEAR((*digests)[s], want, 1e-9 * std::abs(want)) << "stage " << s;
  }
  // Evaluation: outputs come back to the driver through the router.
  auto b = make_batch(99);
  auto out = pipe->forward(b.inputs);
  ASSERT_TRUE(out.has_value()) << out.error_value().message();
  autograd::no_grad_guard no_grad;
  EXPECT_LT(max_abs_diff(*out, reference->forward(autograd::variable(b.inputs)).data()), 1e-12);
  EXPECT_GT(cl.coordinator->router()->stats().data_plane_sends, 0u);
  { auto stopped = std::move(*pipe); } // the stages stop before the cluster
}

INSTANTIATE_TEST_SUITE_P(
  TwoProcesses, RemotePipeline,
  ::testing::Values(remote_case{schedule_kind::one_f_one_b, {"worker0/cpu", "worker1/cpu"}, 4},
                    remote_case{schedule_kind::gpipe, {"worker1/cpu", "worker0/cpu", "worker1/cpu"}, 3},
                    remote_case{schedule_kind::one_f_one_b,
                                {"worker0/cpu", "worker1/cpu", "worker0/cpu", "worker1/cpu"}, 4},
                    remote_case{schedule_kind::one_f_one_b, {"worker0/cpu", "worker1/cpu"}, 3, true}));

/// Kills the second stage's process while steps run: the step in flight (or
/// the next) fails within the timeout, naming the stage.
void killed_stage_process_is_reported(bool overlap_update) {
  troupe::test::cluster cl;
  ASSERT_NO_FATAL_FAILURE(start_cluster(cl));
  auto options = pipeline_options_from(recipe());
  options.places = {"worker0/cpu", "worker1/cpu"};
  options.micro_batches = 3;
  options.overlap_update = overlap_update;
  options.timeout = 5s;
  auto pipe = pipeline::create(*cl.coordinator, std::move(options));
  ASSERT_TRUE(pipe.has_value()) << pipe.error_value().message();
  auto b = make_batch(0);
  ASSERT_TRUE(pipe->train_step(b.inputs, b.targets).has_value());
  // Kill worker1 while steps run; the step in flight (or the next) fails.
  std::thread killer([&] {
    std::this_thread::sleep_for(30ms);
    cl.workers[0].signal(SIGKILL);
  });
  auto started = std::chrono::steady_clock::now();
  expected<double> loss = 0.0;
  for (int i = 0; i < 100000 && loss.has_value(); ++i)
    loss = pipe->train_step(b.inputs, b.targets);
  killer.join();
  auto elapsed = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(loss.has_value());
  EXPECT_THAT(loss.error_value().message(), HasSubstr("stage 1 (worker1/cpu/stage1)"));
  EXPECT_LT(elapsed, 5s + 30ms) << loss.error_value().message();
  auto again = pipe->train_step(b.inputs, b.targets);
  ASSERT_FALSE(again.has_value());
  { auto stopped = std::move(*pipe); } // the stages stop before the cluster
}

TEST(RemotePipelineFailure, KilledStageProcessIsReportedByNameWithinTheTimeout) {
  killed_stage_process_is_reported(false);
}

TEST(RemotePipelineFailure, KilledStageProcessIsReportedWhileUpdatesOverlapTheNextStep) {
  killed_stage_process_is_reported(true);
}

TEST(RemotePipelineFailure, HungStageProcessIsATimeoutNotAHang) {
  troupe::test::cluster cl;
  ASSERT_NO_FATAL_FAILURE(start_cluster(cl));
  auto options = pipeline_options_from(recipe());
  options.places = {"worker0/cpu", "worker1/cpu"};
  options.micro_batches = 2;
  options.timeout = 1s;
  auto pipe = pipeline::create(*cl.coordinator, std::move(options));
  ASSERT_TRUE(pipe.has_value()) << pipe.error_value().message();
  auto b = make_batch(0);
  ASSERT_TRUE(pipe->train_step(b.inputs, b.targets).has_value());
  cl.workers[0].signal(SIGSTOP); // alive but silent: no down message, only the timeout
  struct kill_at_exit {
    child_process& worker;
    ~kill_at_exit() { worker.signal(SIGKILL); }
  } guard{cl.workers[0]};
  // kill() returns before every thread has stopped: wait until they have.
  ASSERT_TRUE(all_threads_stopped(cl.workers[0].pid(), 5s)) << "worker1 did not stop";
  auto started = std::chrono::steady_clock::now();
  auto loss = pipe->train_step(b.inputs, b.targets);
  auto elapsed = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(loss.has_value());
  EXPECT_THAT(loss.error_value().message(), HasSubstr("no progress for 1000 ms"));
  EXPECT_THAT(loss.error_value().message(), HasSubstr("stage 1 (worker1/cpu/stage1)"));
  EXPECT_LT(elapsed, 3s);
  { auto stopped = std::move(*pipe); } // the stages stop before the cluster
}

} // namespace

int main(int argc, char** argv) {
  if (is_stage_child(argc, argv))
    return run_stage_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
