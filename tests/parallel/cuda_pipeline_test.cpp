// Pipelines with stages on CUDA places equal one-process CUDA training: the
// same GPT (float64, same seed and data) trained a few AdamW steps by a
// pipeline whose stages sit on "worker0/cuda:0" (in this process, tensors
// passed by reference on the device), on a CPU stage feeding a CUDA stage
// (the CPU<->GPU map PyTorch RPC refuses), and across two processes sharing
// the GPU (activations and gradients staged through the host and the tensor
// routers); and a hybrid, two replicas of two stages all on the GPU.
// Without a device the same tests run on an emulated one (host memory, the
// CPU's kernels; tests/support/emulated_device.hpp), saying so: that checks
// where every tensor goes and when it moves, not CUDA; and a CUDA place is
// then a usage error naming the device on the real backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "emulated_device.hpp"
#include "ring_support.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/all.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/hybrid.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;

namespace troupe::parallel {
namespace {

using ::testing::HasSubstr;

constexpr std::int64_t vocabulary = 11, sequence = 16, rows = 8;
constexpr int steps = 3;

/// Embedding, two blocks, head: four layers, float64, no dropout.
std::shared_ptr<nn::sequential> make_gpt() {
  return std::make_shared<nn::gpt>(nn::gpt_config{.vocab_size = vocabulary, .block_size = sequence,
                                                  .n_layer = 2, .n_head = 2, .n_embd = 32,
                                                  .type = dtype::float64, .seed = 3});
}

autograd::variable loss_of(const autograd::variable& logits, const tensor& targets) {
  // Any number of rows: a micro-batch's share of the batch.
  return autograd::cross_entropy(autograd::reshape(logits, {-1, vocabulary}), targets.reshape({-1}));
}

optimizer_factory adamw() { return adam_factory({.lr = 3e-3, .weight_decay = 0.01}, /*decoupled=*/true); }

stage_recipe recipe() { return {make_gpt, adamw(), loss_of}; }

struct batch {
  tensor ids;     ///< [rows, sequence], on the CPU as the driver has them
  tensor targets; ///< [rows, sequence]
};

batch make_batch(int step) {
  generator data{100 + static_cast<std::uint64_t>(step)};
  return {randint({rows, sequence}, data, 0, vocabulary), randint({rows, sequence}, data, 0, vocabulary)};
}

struct run_result {
  std::vector<double> losses;
  named_tensors state; // on the CPU
};

/// The reference: the whole model in this process on `where`.
run_result train_alone(device where) {
  auto model = make_gpt();
  model->to(where);
  auto opt = adamw()(model->named_parameters());
  run_result result;
  for (int step = 0; step < steps; ++step) {
    auto b = make_batch(step);
    opt->zero_grad();
    auto loss = loss_of(model->forward(autograd::variable(b.ids.to(where))), b.targets.to(where));
    autograd::backward(loss);
    opt->step();
    result.losses.push_back(loss.item());
  }
  for (auto& [name, value] : model->state_dict())
    result.state.emplace_back(name, value.to(device::cpu()));
  return result;
}

void expect_equal_losses(const run_result& want, const std::vector<double>& losses) {
  ASSERT_EQ(losses.size(), want.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], want.losses[i], 1e-10 * std::max(1.0, want.losses[i])) << "step " << i;
}

void expect_equal(const run_result& want, const std::vector<double>& losses, const named_tensors& state) {
  expect_equal_losses(want, losses);
  ASSERT_EQ(state.size(), want.state.size());
  for (std::size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].first, want.state[i].first);
    EXPECT_LT(max_abs_diff(state[i].second.to(device::cpu()), want.state[i].second), 1e-10) << state[i].first;
  }
}

/// Trains `steps` steps through `pipe` and waits for the last updates.
std::vector<double> train_through(pipeline& pipe) {
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    auto b = make_batch(step);
    auto loss = pipe.train_step(b.ids, b.targets);
    EXPECT_TRUE(loss.has_value()) << loss.error_value().message();
    if (!loss)
      return losses;
    losses.push_back(*loss);
  }
  auto synced = pipe.synchronize();
  EXPECT_TRUE(synced.has_value()) << synced.error_value().message();
  return losses;
}

/// Evaluation through the stages equals the forward of the reference's
/// trained model.
void expect_output_of_trained_reference(pipeline& pipe, const run_result& want) {
  auto b = make_batch(steps);
  auto out = pipe.forward(b.ids);
  ASSERT_TRUE(out.has_value()) << out.error_value().message();
  autograd::no_grad_guard no_grad;
  auto reference = make_gpt();
  ASSERT_TRUE(reference->load_state_dict(want.state).has_value());
  EXPECT_LT(max_abs_diff(out->to(device::cpu()), reference->forward(autograd::variable(b.ids)).data()), 1e-10);
}

bool have_device() { return cuda_device_count() > 0; }

class CudaPipeline : public ::testing::Test {
protected:
  /// Trains `steps` steps through a pipeline over `places` (one per stage,
  /// this process) and compares with the whole model trained on cuda:0.
  void train_and_compare(const std::vector<std::string>& places, schedule_kind schedule, std::size_t micro_batches) {
    const auto want = train_alone(device::cuda(0));
    auto model = make_gpt();
    pipeline_options o;
    o.model = model;
    o.places = places;
    o.schedule = schedule;
    o.micro_batches = micro_batches;
    o.optimizer = adamw();
    o.loss = loss_of;
    o.timeout = 60s;
    o.in_this_process = true;
    auto pipe = pipeline::create(job_, std::move(o));
    ASSERT_TRUE(pipe.has_value()) << pipe.error_value().message();
    const auto losses = train_through(*pipe);
    // Each stage's layers live on its place's device (the slices share the model's modules).
    const auto split = even(places.size(), model->size());
    for (std::size_t s = 0; s < places.size(); ++s)
      for (auto& p : model->slice(split.begin(s), split.end(s))->parameters())
        EXPECT_EQ(p.data().where(), actors::place::parse(places[s])->device) << "stage " << s;
    expect_equal(want, losses, model->state_dict());
    expect_output_of_trained_reference(*pipe, want);
  }

  test::cuda_or_emulated devices_{2}; // before job_: outlives it
  troupe::job job_ = troupe::job::local().value();
};

TEST_F(CudaPipeline, TwoStagesOnOneGpuEqualOneProcess) {
  train_and_compare({"worker0/cuda:0", "worker0/cuda:0"}, schedule_kind::one_f_one_b, 2);
}

TEST_F(CudaPipeline, StagesOnTwoGpusEqualOneProcess) {
  // Activations and gradients cross from one device to the other; each
  // stage's thread works on its own device.
  if (devices_.ordinals() < 2)
    GTEST_SKIP() << "needs two CUDA devices, this machine has " << devices_.ordinals();
  train_and_compare({"worker0/cuda:0", "worker0/cuda:1"}, schedule_kind::one_f_one_b, 2);
}

TEST_F(CudaPipeline, ACpuStageFeedingAGpuStageEqualsOneProcess) {
  train_and_compare({"worker0/cpu", "worker0/cuda:0"}, schedule_kind::gpipe, 2);
}

TEST_F(CudaPipeline, AGpuStageFeedingACpuStageEqualsOneProcess) {
  train_and_compare({"worker0/cuda:0", "worker0/cpu"}, schedule_kind::one_f_one_b, 4);
}

TEST_F(CudaPipeline, TwoReplicasOfTwoStagesOnOneGpuEqualOneProcess) {
  // Hybrid: each stage's two replicas share cuda:0, so they average their
  // gradients through the host ring (NCCL takes one GPU per rank).
  const auto want = train_alone(device::cuda(0));
  auto node = test::start_local_node();
  ASSERT_TRUE(node) << node.error().message();
  register_stage_factory(**node, recipe());
  hybrid_options o;
  o.recipe = recipe();
  o.places = {{"worker0/cuda:0", "worker0/cuda:0"}, {"worker0/cuda:0", "worker0/cuda:0"}};
  o.pipeline.schedule = schedule_kind::one_f_one_b;
  o.pipeline.micro_batches = 2;
  o.pipeline.timeout = 60s;
  o.bucket_bytes = 4096; // several buckets per stage
  {
    auto hybrid = hybrid_pipeline::create(**node, std::move(o));
    ASSERT_TRUE(hybrid) << hybrid.error().message();
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      auto b = make_batch(step);
      auto loss = hybrid->train_step(b.ids, b.targets);
      ASSERT_TRUE(loss) << loss.error().message();
      losses.push_back(*loss);
    }
    ASSERT_TRUE(hybrid->synchronize());
    expect_equal_losses(want, losses);
    // Each replica's trained parameters, seen through its evaluation output.
    expect_output_of_trained_reference(hybrid->replica(0), want);
    expect_output_of_trained_reference(hybrid->replica(1), want);
  }
  (*node)->stop();
}

// -- across processes ------------------------------------------------------

bool is_stage_child(int argc, char** argv) { return argc > 1 && std::string_view(argv[1]) == "--stage-child"; }

/// worker1: a node with the stage factory, until stdin closes.
int run_stage_child(int argc, char** argv) {
  test::cuda_or_emulated devices(2); // as the parent has
  return test::serve_as_child_node(argc, argv, [](actors::node& node) {
    register_stage_factory(node, recipe());
    return std::function<void()>{};
  });
}

/// Trains through stages at `places` in this process (worker0) and a child
/// (worker1), and compares with the whole model trained on cuda:0.
void train_in_two_processes_and_compare(const std::vector<std::string>& places) {
  const auto want = train_alone(device::cuda(0));
  test::cluster cluster;
  ASSERT_NO_FATAL_FAILURE(test::start_cluster(cluster, 2, "--stage-child"));
  register_stage_factory(*cluster.coordinator, recipe());
  ASSERT_TRUE(cluster.workers[0].wait_for("READY", 30s)) << cluster.workers[0].output();
  {
    auto o = pipeline_options_from(recipe());
    o.places = places;
    o.micro_batches = 2;
    o.timeout = 60s;
    auto pipe = pipeline::create(*cluster.coordinator, o);
    ASSERT_TRUE(pipe.has_value()) << pipe.error_value().message();
    const auto losses = train_through(*pipe);
    // Each process built its own model and trained its own stage (the
    // factory's recipe), so the trained parameters are read through the
    // output: after the steps, the output through both processes equals the
    // reference model's.
    expect_equal_losses(want, losses);
    expect_output_of_trained_reference(*pipe, want);
  }
}

TEST_F(CudaPipeline, StagesInTwoProcessesOnOneGpuEqualOneProcess) {
  train_in_two_processes_and_compare({"worker0/cuda:0", "worker1/cuda:0"});
}

TEST_F(CudaPipeline, StagesInTwoProcessesOnTwoGpusEqualOneProcess) {
  // The activations leave cuda:0 through the host and land on cuda:1.
  if (devices_.ordinals() < 2)
    GTEST_SKIP() << "needs two CUDA devices, this machine has " << devices_.ordinals();
  train_in_two_processes_and_compare({"worker0/cuda:0", "worker1/cuda:1"});
}

// -- without a device --------------------------------------------------------

TEST(CudaPipelineWithoutDevice, ACudaPlaceIsAUsageErrorNamingTheDevice) {
  if (have_device())
    GTEST_SKIP() << "this machine has " << cuda_device_count() << " CUDA device(s)";
  auto job = troupe::job::local().value();
  pipeline_options o;
  o.model = make_gpt();
  o.places = {"worker0/cpu", "worker0/cuda:0"};
  o.optimizer = adamw();
  o.loss = loss_of;
  o.in_this_process = true;
  try {
    auto pipe = pipeline::create(job, std::move(o));
    ADD_FAILURE() << "a pipeline stage on cuda:0 without a device";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cuda:0"));
  }
}

} // namespace
} // namespace troupe::parallel

int main(int argc, char** argv) {
  if (troupe::parallel::is_stage_child(argc, argv))
    return troupe::parallel::run_stage_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
