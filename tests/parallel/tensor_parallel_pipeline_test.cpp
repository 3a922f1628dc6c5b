// Tensor x pipeline (x data) equals one process: a GPT cut into 2 stages,
// each stage split over 2 tensor ranks (and the whole replicated twice,
// each replica on half the batch), trains to nn::gpt's losses and
// parameters; the mesh names which ranks share a group along each axis.
#include "troupe/parallel/tensor_parallel_pipeline.hpp"

#include "stage.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include "../actors/process_support.hpp"
#include "emulated_device.hpp"
#include "gpt_reference.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/parallel/tensor_parallel_transformer.hpp"
#include "troupe/parallel/vocab_parallel.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

using autograd::variable;

const nn::gpt_config config{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 12,
                            .type = dtype::float64, .seed = 21};
constexpr std::int64_t rows = 4, seq = 5;
constexpr int steps = 3;

tensor token_ids(int step, std::uint64_t salt) {
  generator gen{500 + salt + static_cast<std::uint64_t>(step)};
  return randint({rows, seq}, gen, 0, config.vocab_size);
}

/// The mean cross entropy over the tokens, each rank holding its classes.
loss_function vocab_parallel_loss(reducer_group& group) {
  return [&group](const variable& logits, const tensor& targets) {
    const auto tokens = targets.numel(), classes = logits.data().shape()[2];
    return vocab_parallel_cross_entropy(autograd::reshape(logits, {tokens, classes}), targets.reshape({tokens}), group,
                                        config.vocab_size);
  };
}

/// 2 stages x 2 tensor ranks at `places` (x `data` replicas), 2
/// micro-batches under 1F1B: every step's loss and, afterwards, every
/// rank's pieces equal nn::gpt trained on the whole batch in one process
/// on the CPU, and the last stage's pieces are on its place's device.
void expect_trains_like_one_process(std::uint32_t data, bool sequence_parallel, const std::vector<std::string>& places) {
  SCOPED_TRACE(places[0] + ", " + places[1]);
  const auto one_process = test::train_gpt(config, steps, token_ids);
  const auto& want_losses = one_process.losses;
  const auto& want = one_process.parameters;

  auto job = troupe::job::local().value();
  auto made = tensor_parallel_pipeline::create(
      job, {.tensor = 2, .data = data,
                   .model = [&](reducer_group& group) {
                     return std::make_shared<parallel_gpt>(config, group, tensor_parallel_options{sequence_parallel});
                   },
                   .loss = vocab_parallel_loss,
                   .pipeline = {.places = places, .micro_batches = 2,
                                .optimizer = sgd_factory({.lr = 0.1}), .in_this_process = true}});
  ASSERT_TRUE(made) << made.error_value().message();
  auto tp = std::move(*made);
  for (int s = 0; s < steps; ++s) {
    const auto ids = token_ids(s, 0), targets = token_ids(s, 1);
    auto loss = tp.train_step(ids, targets);
    ASSERT_TRUE(loss) << loss.error_value().message();
    EXPECT_NEAR(*loss, want_losses[s], 1e-10 * (1 + want_losses[s])) << "step " << s;
  }
  const auto last_device = actors::place::parse(places.back())->device;
  for (std::uint32_t d = 0; d < data; ++d)
    for (std::uint32_t t = 0; t < 2; ++t) {
      auto same = pieces_equal(tp.model(d, t), want, 1e-10);
      EXPECT_TRUE(same) << "replica " << d << ", tensor rank " << t << ": " << same.error().message();
      EXPECT_EQ(tp.model(d, t).named_parameters().back().second.data().where(), last_device)
        << "replica " << d << ", tensor rank " << t << "'s last stage";
    }
  // The check can fail: the untrained model's pieces differ.
  EXPECT_FALSE(pieces_equal(tp.model(0, 1), nn::gpt(config).state_dict(), 1e-10));
}

class TensorTimesPipeline : public ::testing::TestWithParam<std::tuple<std::uint32_t, bool>> {};

// Sequence parallelism on and off, 1 and 2 replicas.
TEST_P(TensorTimesPipeline, TrainsLikeOneProcess) {
  const auto [data, sequence_parallel] = GetParam();
  expect_trains_like_one_process(data, sequence_parallel, {"worker0/cpu", "worker0/cpu"});
}

INSTANTIATE_TEST_SUITE_P(Replicas, TensorTimesPipeline, ::testing::Combine(::testing::Values(1u, 2u), ::testing::Bool()));

class TensorTimesPipelineOnCuda : public ::testing::TestWithParam<std::tuple<std::uint32_t, bool>> {};

// The same on CUDA places: both stages on cuda:0, every tensor rank's
// pieces there, the layers' collectives staged through the host; then a
// CPU stage feeding a GPU stage. Against nn::gpt on the CPU (float64:
// within 1e-10).
TEST_P(TensorTimesPipelineOnCuda, TrainsLikeOneProcessOnTheCpu) {
  const auto [data, sequence_parallel] = GetParam();
  test::cuda_or_emulated devices(1); // before the jobs: outlives them
  expect_trains_like_one_process(data, sequence_parallel, {"worker0/cuda:0", "worker0/cuda:0"});
  expect_trains_like_one_process(data, sequence_parallel, {"worker0/cpu", "worker0/cuda:0"});
}

INSTANTIATE_TEST_SUITE_P(Replicas, TensorTimesPipelineOnCuda,
                         ::testing::Combine(::testing::Values(1u, 2u), ::testing::Bool()));

TEST(TensorTimesPipelineLayout, TheMeshNamesTheGroupsTensorInnermost) {
  auto job = troupe::job::local().value();
  auto made = tensor_parallel_pipeline::create(
      job, {.tensor = 2, .data = 2,
                   .model = [&](reducer_group& group) { return std::make_shared<parallel_gpt>(config, group); },
                   .loss = vocab_parallel_loss,
                   .pipeline = {.places = {"worker0/cpu", "worker0/cpu"}, .micro_batches = 2,
                                .optimizer = sgd_factory({.lr = 0.1}), .in_this_process = true}});
  ASSERT_TRUE(made) << made.error_value().message();
  const auto& grid = made->layout();
  ASSERT_EQ(grid.axes().size(), 3u);
  EXPECT_EQ(grid.axes()[0].name, "data");
  EXPECT_EQ(grid.axes()[1].name, "pipeline");
  EXPECT_EQ(grid.axes()[2].name, "tensor");
  EXPECT_EQ(grid.size(), 8u);
  // Rank 5 = replica 1, stage 0, tensor rank 1.
  EXPECT_EQ(grid.group(5, "tensor"), (std::vector<std::uint32_t>{4, 5}));
  EXPECT_EQ(grid.group(5, "pipeline"), (std::vector<std::uint32_t>{5, 7}));
  EXPECT_EQ(grid.group(5, "data"), (std::vector<std::uint32_t>{1, 5}));
  EXPECT_THROW((void)made->model(2, 0), usage_error);
}

// Across processes every rank of the mesh is a process of the job
// (examples/check_tensor_parallel_demo.sh trains such layouts); a layout
// the job's processes do not fill, or stages in other processes on a node of
// the program's own, is refused naming why.
TEST(TensorTimesPipelineLayout, LayoutsTheProcessesDoNotFitAreRefusedNamingWhy) {
  auto job = troupe::job::local().value();
  const tensor_parallel_pipeline_options across{
    .tensor = 2,
    .model = [&](reducer_group& group) { return std::make_shared<parallel_gpt>(config, group); },
    .loss = vocab_parallel_loss,
    .pipeline = {.optimizer = sgd_factory({.lr = 0.1})}};
  try {
    (void)tensor_parallel_pipeline::create(job, across);
    ADD_FAILURE() << "2 tensor ranks were accepted in a job of one process";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("1 processes for 2 tensor ranks x 1 replicas"));
  }
  auto places = across;
  places.tensor = 1;
  places.pipeline.places = {"worker0/cpu", "worker0/cpu"};
  try {
    (void)tensor_parallel_pipeline::create(job, places);
    ADD_FAILURE() << "two places for a job of one process were accepted";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("2 places for 1 processes"));
  }
  try {
    (void)tensor_parallel_pipeline::create(job.node(), across);
    ADD_FAILURE() << "remote stages on the program's own node were accepted";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("set in_this_process, or create it from the job on every rank"));
  }
}

// A model factory that refuses the degree (3 heads over 4 tensor ranks)
// makes create() fail naming why; the process goes on.
TEST(TensorTimesPipelineLayout, AModelThatRefusesTheDegreeIsAnErrorOfCreate) {
  auto job = troupe::job::local().value();
  auto made = tensor_parallel_pipeline::create(
    job, {.tensor = 4,
          .model = [&](reducer_group& group) { return std::make_shared<parallel_gpt>(config, group); },
          .loss = vocab_parallel_loss,
          .pipeline = {.places = {"worker0/cpu"}, .optimizer = sgd_factory({.lr = 0.1}), .in_this_process = true}});
  ASSERT_FALSE(made);
  EXPECT_THAT(made.error_value().message(),
              ::testing::HasSubstr("tensor_parallel_pipeline: parallel_self_attention: 3 heads over 4 ranks leave a "
                                   "rank without a head"));
}

// One process is a mesh of one rank: the stage is prepared, the driver
// starts it through the node factory as it would in another process, and
// training equals nn::gpt's; digests are the driver's view of the pieces.
TEST(TensorTimesPipelineLayout, OneProcessJobRunsTheAcrossProcessesPath) {
  const auto one_process = test::train_gpt(config, steps, token_ids);
  auto job = troupe::job::local().value();
  auto made = tensor_parallel_pipeline::create(
      job, {.tensor = 1,
                   .model = [&](reducer_group& group) { return std::make_shared<parallel_gpt>(config, group); },
                   .loss = vocab_parallel_loss,
                   .pipeline = {.micro_batches = 2, .optimizer = sgd_factory({.lr = 0.1})}});
  ASSERT_TRUE(made) << made.error_value().message();
  for (int s = 0; s < steps; ++s) {
    auto loss = made->train_step(token_ids(s, 0), token_ids(s, 1));
    ASSERT_TRUE(loss) << loss.error_value().message();
    EXPECT_NEAR(*loss, one_process.losses[s], 1e-10 * (1 + one_process.losses[s])) << "step " << s;
  }
  auto digests = made->parameter_digests(0, 0);
  ASSERT_TRUE(digests) << digests.error_value().message();
  ASSERT_EQ(digests->size(), 1u);
  double want = 0;
  for (const auto& [name, value] : one_process.parameters)
    for (double v : value.to_vector<double>())
      want += v + v * v;
  EXPECT_NEAR((*digests)[0], want, 1e-9 * std::abs(want));
  EXPECT_THROW((void)made->model(0, 0), usage_error);

  // The prepared stage's factory takes specs from other processes: one that
  // asks for another stage, or other layers, is refused naming both.
  stage_spec wrong;
  wrong.end = 1;
  auto spawned = job.node().spawn_remote(*actors::place::parse_named("worker0/cpu/d0.t1.stage0"),
                                         "troupe.tensor_parallel_stage", to_message(wrong));
  ASSERT_FALSE(spawned);
  EXPECT_THAT(spawned.error().message(),
              ::testing::HasSubstr("tensor-parallel stage worker0/cpu/d0.t1.stage0 with layers [0, 1) was asked for, "
                                   "but this process prepared d0.t0.stage0 with layers [0, 4)"));
}

// -- across processes, on CUDA places ---------------------------------------------------------

/// Both ranks' tensor x pipeline: 2 tensor ranks of one stage, rank k on
/// its node's cuda:0.
expected<tensor_parallel_pipeline> two_tensor_ranks_on_cuda(troupe::job& job) {
  return tensor_parallel_pipeline::create(
    job, {.tensor = 2,
          .model = [](reducer_group& group) { return std::make_shared<parallel_gpt>(config, group); },
          .loss = vocab_parallel_loss,
          .pipeline = {.places = job.places("cuda:0"), .micro_batches = 2, .optimizer = sgd_factory({.lr = 0.1})}});
}

// Every rank a process of its own, each tensor rank's pieces on its node's
// cuda:0: the group's collectives cross processes (the same-host path) from
// GPU memory through the host. The driver's losses equal nn::gpt's on the
// CPU in one process, and both processes computed on the device.
TEST(TensorTimesPipelineAcrossProcesses, TwoTensorRanksOnCudaPlacesTrainLikeOneProcessOnTheCpu) {
  test::cuda_or_emulated devices(1);
  const auto one_process = test::train_gpt(config, steps, token_ids);
  const auto port = test::unused_port();
  auto flags = test::rank_flags(1, "beta", port);
  flags.insert(flags.begin(), "--tensor-rank-child");
  auto child = test::child_process::start(test::child_process::self_path(), flags,
                                          {"TROUPE_COORDINATOR=", "TROUPE_RANK=", "TROUPE_WORLD_SIZE=",
                                           "TROUPE_NODE_NAME=", "TROUPE_TRACE_DIR="});
  auto args = test::rank_flags(0, "alpha", port);
  args.insert(args.begin(), "tensor_parallel_pipeline_test");
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  troupe::job job(static_cast<int>(argv.size()), argv.data());
  auto started = job.try_start();
  ASSERT_TRUE(started) << started.error().message() << child.output();
  const auto before = devices.emulated_allocations();
  auto made = two_tensor_ranks_on_cuda(job);
  ASSERT_TRUE(made) << made.error_value().message() << child.output();
  for (int s = 0; s < steps; ++s) {
    auto loss = made->train_step(token_ids(s, 0), token_ids(s, 1));
    ASSERT_TRUE(loss) << loss.error_value().message() << child.output();
    EXPECT_NEAR(*loss, one_process.losses[s], 1e-10 * (1 + one_process.losses[s])) << "step " << s;
  }
  if (devices.emulated()) {
    EXPECT_GT(devices.emulated_allocations(), before) << "the driver's stage computed on the device";
  }
  EXPECT_EQ(job.finish(0), 0);
  auto status = child.exited(std::chrono::seconds(30));
  ASSERT_TRUE(status) << child.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << child.output();
  if (devices.emulated()) {
    EXPECT_THAT(child.output(), ::testing::ContainsRegex("device blocks [1-9]"))
      << "the other tensor rank's stage computed on the device";
  }
}

/// Rank 1 of the test above: makes its tensor rank, serves, and says how
/// many device blocks it used.
int tensor_rank_child(int argc, char** argv) {
  test::cuda_or_emulated devices(1);
  troupe::job job(argc, argv);
  if (auto ok = job.try_start(); !ok) {
    std::printf("start failed: %s\n", ok.error().message().c_str());
    return 1;
  }
  auto made = two_tensor_ranks_on_cuda(job);
  if (!made) {
    std::printf("create failed: %s\n", made.error_value().message().c_str());
    return job.finish(1);
  }
  const int served = job.serve();
  std::printf("device blocks %d\n", devices.emulated_allocations());
  std::fflush(stdout);
  return served;
}

} // namespace
} // namespace troupe::parallel

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "--tensor-rank-child") {
    argv[1] = argv[0]; // the job's flags follow
    return troupe::parallel::tensor_rank_child(argc - 1, argv + 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
