// Distributed checkpoints saved at one layout and resumed at another: one
// process, pipelines of 2 and 3 stages with different splits, data parallel
// over 2 and 3 replicas, hybrid 2 x 2, a pipeline whose stages are on
// cuda:0 and 2 replicas sharing cuda:0 (on an emulated device without a
// GPU). Training resumed from step 3 must give
// the losses, parameters and optimizer state of an uninterrupted run. Then
// what may go wrong: another model, a damaged shard, a save cut short, a
// writer that never reports, and the values an asynchronous save writes.
#include "troupe/parallel/checkpoints.hpp"

#include <unistd.h>

#include <barrier>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "emulated_device.hpp"
#include "ring_support.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/hybrid.hpp"
#include "troupe/parallel/mesh.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/parallel/tensor_parallel_pipeline.hpp"
#include "troupe/parallel/tensor_parallel_transformer.hpp"
#include "troupe/parallel/vocab_parallel.hpp"
#include "troupe/serialization/checkpoint_directory.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr int saved_at = 3;
constexpr int last_step = 6;
constexpr std::int64_t rows = 12;

/// 6 x (Linear(16, 16) + ReLU) in float64: 12 layers.
std::shared_ptr<nn::sequential> make_mlp(std::int64_t width = 16) {
  auto model = std::make_shared<nn::sequential>();
  for (int i = 0; i < 6; ++i) {
    nn::linear_options o;
    o.in_features = width;
    o.out_features = width;
    o.type = dtype::float64;
    model->append(nn::make<nn::linear>(o));
    model->append(nn::make<nn::relu>());
  }
  model->reset_parameters(11);
  return model;
}

optimizer_factory adam() { return adam_factory({.lr = 0.01}); }
stage_recipe recipe() { return {[] { return make_mlp(); }, adam(), mse_loss_function()}; }

struct batch {
  tensor inputs;
  tensor targets;
};

/// The data of step `step`: a function of the step, so a resumed run sees
/// what an uninterrupted one saw.
batch make_batch(std::int64_t step) {
  generator gen{500 + static_cast<std::uint64_t>(step)};
  return {randn({rows, 16}, gen, 0.0, 1.0, dtype::float64), randn({rows, 16}, gen, 0.0, 1.0, dtype::float64)};
}

double train_step(nn::module& model, optim::optimizer& opt, const batch& b) {
  auto loss = autograd::mse_loss(model.forward(autograd::variable(b.inputs)), autograd::variable(b.targets));
  autograd::backward(loss);
  opt.step();
  opt.zero_grad();
  return loss.item();
}

/// An uninterrupted run of steps 1..last_step in one process.
struct reference_run {
  std::shared_ptr<nn::sequential> model = make_mlp();
  std::unique_ptr<optim::optimizer> opt = adam()(model->named_parameters());
  std::vector<double> losses;
  reference_run() {
    for (int step = 1; step <= last_step; ++step)
      losses.push_back(train_step(*model, *opt, make_batch(step)));
  }
};

const reference_run& reference() {
  static const reference_run run;
  return run;
}

enum class layout_kind { one_process, pipeline, data_parallel, hybrid };

struct layout {
  layout_kind kind;
  std::vector<std::size_t> boundaries{}; ///< pipeline: the split's layer boundaries
  std::uint32_t replicas = 1;           ///< data parallel
  std::string name;
  std::string device = "cpu"; ///< pipeline: every stage's device; data parallel: every replica's
};

void PrintTo(const layout& l, std::ostream* os) { *os << l.name; }

checkpoint_options options_in(const fs::path& directory) {
  return {.directory = directory, .every = saved_at, .keep_last = 2, .asynchronous = true, .timeout = 20s};
}

/// make_mlp(width) and Adam, tracked by checkpoints made with `options`.
struct tracked_mlp {
  explicit tracked_mlp(checkpoint_options options, std::int64_t width = 16)
      : model(make_mlp(width)), opt(adam()(model->named_parameters())),
        ckpt(checkpoints::create(std::move(options)).value()) {
    ckpt.track(*model, *opt);
  }
  std::shared_ptr<nn::sequential> model;
  std::unique_ptr<optim::optimizer> opt;
  checkpoints ckpt;
};

/// Every state_dict tensor's values, copied (state_dict() aliases them).
std::vector<std::vector<double>> values_of(const nn::module& model) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, value] : model.state_dict())
    out.push_back(value.to_vector<double>());
  return out;
}

/// Resumes `ckpt`, trains the steps after its checkpoint up to `until`
/// (`train(step)`: the step's loss), saving when due, and waits for the
/// last save; the losses.
expected<std::vector<double>> resume_and_train(checkpoints& ckpt, int until,
                                               const std::function<expected<double>(std::int64_t)>& train) {
  auto done = ckpt.resume();
  if (!done)
    return done.error();
  std::vector<double> losses;
  for (auto step = *done + 1; step <= until; ++step) {
    auto loss = train(step);
    if (!loss)
      return loss.error();
    losses.push_back(*loss);
    if (auto saved = ckpt.save_if_due(step); !saved)
      return saved.error();
  }
  if (auto ok = ckpt.wait(); !ok)
    return ok.error();
  return losses;
}

/// A replica's step: backward with its replicas' gradients averaged, the
/// optimizer's update; its own loss.
expected<double> replica_step(data_parallel& dp, optim::optimizer& opt, const autograd::variable& loss) {
  if (auto ok = dp.backward(loss); !ok)
    return ok.error();
  opt.step();
  opt.zero_grad();
  return loss.item();
}

/// Runs steps (resumed) .. `until` at layout `l` with checkpoints in
/// `directory`, saving when due; the losses of the steps it ran.
std::vector<double> run(const layout& l, const fs::path& directory, int until) {
  std::vector<double> losses;
  auto fail = [&](const error& e) {
    ADD_FAILURE() << l.name << ": " << e.message();
    return losses;
  };
  switch (l.kind) {
  case layout_kind::one_process: {
    tracked_mlp one(options_in(directory));
    auto trained = resume_and_train(one.ckpt, until, [&](std::int64_t step) -> expected<double> {
      return train_step(*one.model, *one.opt, make_batch(step));
    });
    return trained ? *trained : fail(trained.error());
  }
  case layout_kind::pipeline: {
    // Stages on a GPU save host copies and load onto the device; without a
    // GPU on an emulated one (emulated_device.hpp), which checks placement.
    std::optional<test::cuda_or_emulated> devices;
    if (l.device != "cpu")
      devices.emplace(1);
    auto job = troupe::job::local().value();
    pipeline_options o;
    o.model = make_mlp();
    o.places.assign(l.boundaries.size() + 1, "worker0/" + l.device);
    auto split = from_split_points(l.boundaries, o.model->size());
    o.split = split;
    o.micro_batches = 2;
    o.optimizer = adam();
    o.loss = mse_loss_function();
    o.in_this_process = true;
    auto pipe = pipeline::create(job, std::move(o));
    if (!pipe)
      return fail(pipe.error());
    auto ckpt = checkpoints::create(job, options_in(directory)).value();
    ckpt.track(*pipe);
    auto trained = resume_and_train(ckpt, until, [&](std::int64_t step) {
      auto b = make_batch(step);
      return pipe->train_step(b.inputs, b.targets);
    });
    return trained ? *trained : fail(trained.error());
  }
  case layout_kind::data_parallel: {
    // Replicas sharing a GPU reduce through the host ring (NCCL takes one
    // GPU per rank), which data_parallel chooses by itself.
    std::optional<test::cuda_or_emulated> devices;
    if (l.device != "cpu")
      devices.emplace(1);
    const auto where = *device::parse(l.device);
    test::local_ring ring(l.replicas);
    std::vector<std::vector<double>> per_replica(l.replicas);
    std::mutex failures;
    std::vector<std::string> errors;
    ring.each([&](std::uint32_t k) {
      auto report = [&](const error& e) {
        std::lock_guard lock(failures);
        errors.push_back(fmt::format("replica {}: {}", k, e.message()));
      };
      auto model = make_mlp();
      model->to(where);
      auto dp = data_parallel::create(model->named_parameters(), *ring.groups[k]);
      if (!dp)
        return report(dp.error());
      auto opt = adam()(model->named_parameters());
      auto ckpt = checkpoints::create(options_in(directory)).value();
      ckpt.track(*model, *opt, *dp);
      const auto share = rows / l.replicas;
      auto trained = resume_and_train(ckpt, until, [&](std::int64_t step) -> expected<double> {
        auto b = make_batch(step);
        auto x = b.inputs.narrow(0, k * share, share).to(where).contiguous();
        auto y = b.targets.narrow(0, k * share, share).to(where).contiguous();
        return replica_step(*dp, *opt, autograd::mse_loss(model->forward(autograd::variable(x)), autograd::variable(y)));
      });
      if (!trained)
        return report(trained.error());
      per_replica[k] = *trained;
    });
    for (const auto& e : errors)
      ADD_FAILURE() << l.name << ": " << e;
    // Equal shards: the batch's mean loss is the mean of the replicas'.
    for (std::size_t i = 0; i < per_replica[0].size(); ++i) {
      double sum = 0;
      for (const auto& r : per_replica)
        sum += r.at(i);
      losses.push_back(sum / l.replicas);
    }
    return losses;
  }
  case layout_kind::hybrid: {
    auto node = test::start_local_node();
    if (!node)
      return fail(node.error());
    register_stage_factory(**node, recipe());
    hybrid_options o;
    o.recipe = recipe();
    o.places = {{"worker0/cpu", "worker0/cpu"}, {"worker0/cpu", "worker0/cpu"}};
    o.pipeline.micro_batches = 2;
    o.pipeline.timeout = 10s;
    o.bucket_bytes = 2048;
    {
      auto hybrid = hybrid_pipeline::create(**node, std::move(o));
      if (!hybrid)
        return fail(hybrid.error());
      auto ckpt = checkpoints::create(options_in(directory)).value();
      ckpt.track(*hybrid);
      auto trained = resume_and_train(ckpt, until, [&](std::int64_t step) {
        auto b = make_batch(step);
        return hybrid->train_step(b.inputs, b.targets);
      });
      if (!trained)
        return fail(trained.error());
      losses = *trained;
    }
    (*node)->stop();
    return losses;
  }
  }
  return losses;
}

/// Every tensor of the checkpoint of step `step` against the reference
/// run's model and optimizer state after that step.
void expect_reference_state(const fs::path& directory, const std::string& what) {
  auto reader = checkpoint_reader::open(checkpoint_path(directory, last_step));
  ASSERT_TRUE(reader) << what << ": " << reader.error().message();
  named_tensors want;
  for (auto& [name, value] : reference().model->state_dict())
    want.emplace_back("model." + name, value);
  for (auto& [name, value] : reference().opt->state_dict())
    want.emplace_back("optimizer." + name, value);
  ASSERT_EQ(reader->manifest().tensors.size(), want.size()) << what;
  for (const auto& [name, value] : want) {
    auto saved = reader->read(name);
    ASSERT_TRUE(saved) << what << ": " << saved.error().message();
    auto got = saved->to_vector<double>();
    auto expected_values = value.to_vector<double>();
    ASSERT_EQ(got.size(), expected_values.size()) << what << ": " << name;
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], expected_values[i], 1e-9 * (1 + std::abs(expected_values[i])))
        << what << ": " << name << " element " << i;
  }
}

class ScratchDirectory : public ::testing::Test {
protected:
  void SetUp() override {
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (auto& c : test)
      if (c == '/')
        c = '_';
    directory_ = fs::temp_directory_path() / fmt::format("troupe-checkpoints-{}-{}", ::getpid(), test);
    fs::remove_all(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  fs::path directory_;
};

const std::vector<layout> layouts = {
  {layout_kind::one_process, {}, 1, "one process"},
  {layout_kind::pipeline, {6}, 1, "pipeline 2 stages split at 6"},
  {layout_kind::pipeline, {2}, 1, "pipeline 2 stages split at 2"},
  {layout_kind::pipeline, {4, 8}, 1, "pipeline 3 stages"},
  {layout_kind::pipeline, {2, 10}, 1, "pipeline 3 stages uneven"},
  {layout_kind::pipeline, {6}, 1, "pipeline 2 stages on cuda:0", "cuda:0"},
  {layout_kind::data_parallel, {}, 2, "data parallel 2"},
  {layout_kind::data_parallel, {}, 3, "data parallel 3"},
  {layout_kind::data_parallel, {}, 2, "data parallel 2 on cuda:0", "cuda:0"},
  {layout_kind::hybrid, {}, 1, "hybrid 2 x 2"},
};

using layout_pair = std::pair<layout, layout>;

class ResumeAtAnotherLayout : public ScratchDirectory, public ::testing::WithParamInterface<layout_pair> {};

TEST_P(ResumeAtAnotherLayout, GivesTheLossesParametersAndOptimizerStateOfAnUninterruptedRun) {
  const auto& [saving, loading] = GetParam();
  auto first = run(saving, directory_, saved_at);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(first.size(), std::size_t(saved_at));
  for (int i = 0; i < saved_at; ++i)
    EXPECT_NEAR(first[i], reference().losses[i], 1e-10) << saving.name << " step " << i + 1;
  auto second = run(loading, directory_, last_step);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(second.size(), std::size_t(last_step - saved_at)) << "did " << loading.name << " resume at step 3?";
  for (int i = 0; i < last_step - saved_at; ++i)
    EXPECT_NEAR(second[i], reference().losses[saved_at + i], 1e-10) << loading.name << " step " << saved_at + i + 1;
  expect_reference_state(directory_, saving.name + " -> " + loading.name);
}

std::vector<layout_pair> every_pair() {
  std::vector<layout_pair> out;
  for (const auto& a : layouts)
    for (const auto& b : layouts)
      if (a.name != b.name)
        out.emplace_back(a, b);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ResumeAtAnotherLayout, ::testing::ValuesIn(every_pair()),
                         [](const auto& info) {
                           std::string name = info.param.first.name + " to " + info.param.second.name;
                           for (auto& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c)))
                               c = '_';
                           return name;
                         });

// A tensor-parallel GPT (vocabulary 11, 3 heads: degrees 2 and 3 divide
// neither) saved at one degree and resumed at another or in one process.
constexpr std::int64_t gpt_vocabulary = 11;
const nn::gpt_config gpt_config{.vocab_size = gpt_vocabulary, .block_size = 8, .n_layer = 2, .n_head = 3,
                                .n_embd = 12, .type = dtype::float64, .seed = 21};

tensor gpt_ids(std::int64_t step, std::uint64_t salt) {
  generator gen{700 + salt + static_cast<std::uint64_t>(step)};
  return randint({2, 5}, gen, 0, gpt_vocabulary);
}

/// Steps (resumed) .. `until` of the GPT at tensor-parallel `degree` (1: nn::gpt in one process).
std::vector<double> run_gpt(std::uint32_t degree, const fs::path& directory, int until) {
  auto options = options_in(directory);
  if (degree == 1) {
    nn::gpt model(gpt_config);
    auto opt = adam()(model.named_parameters());
    auto ckpt = checkpoints::create(options).value();
    ckpt.track(model, *opt);
    auto trained = resume_and_train(ckpt, until, [&](std::int64_t step) -> expected<double> {
      auto logits = model(autograd::variable(gpt_ids(step, 0)));
      auto loss = autograd::cross_entropy(autograd::reshape(logits, {10, gpt_vocabulary}), gpt_ids(step, 1).reshape({10}));
      autograd::backward(loss);
      opt->step();
      opt->zero_grad();
      return loss.item();
    });
    if (!trained)
      ADD_FAILURE() << "one process: " << trained.error().message();
    return trained ? *trained : std::vector<double>{};
  }
  test::local_ring ring(degree);
  std::vector<std::vector<double>> losses(degree);
  ring.each([&](std::uint32_t r) {
    auto& group = *ring.groups[r];
    parallel_gpt model(gpt_config, group, {.sequence_parallel = true});
    auto opt = adam()(model.named_parameters());
    auto ckpt = checkpoints::create(options).value();
    ckpt.track(model, *opt, group);
    auto trained = resume_and_train(ckpt, until, [&](std::int64_t step) -> expected<double> {
      auto logits = model(autograd::variable(gpt_ids(step, 0)));
      auto classes = logits.data().shape()[2];
      auto loss = vocab_parallel_cross_entropy(autograd::reshape(logits, {10, classes}), gpt_ids(step, 1).reshape({10}),
                                               group, gpt_vocabulary);
      autograd::backward(loss);
      opt->step();
      opt->zero_grad();
      return loss.item();
    });
    if (!trained)
      ADD_FAILURE() << "rank " << r << " of " << degree << ": " << trained.error().message();
    else
      losses[r] = *trained;
  });
  for (std::uint32_t r = 1; r < degree; ++r)
    EXPECT_EQ(losses[r], losses[0]) << "the members' losses differ";
  return losses[0];
}

/// Steps (resumed) .. `until` of the GPT on a mesh {data: 2, tensor: 2}:
/// each replica trains on its half of the batch; the mean loss.
std::vector<double> run_gpt_mesh(const fs::path& directory, int until) {
  auto node = test::start_local_node();
  if (!node) {
    ADD_FAILURE() << node.error().message();
    return {};
  }
  auto grid = mesh::create({{"data", 2}, {"tensor", 2}}, std::vector<std::string>(4, "worker0/cpu")).value();
  std::vector<std::vector<double>> losses(4);
  std::vector<std::thread> ranks;
  for (std::uint32_t rank = 0; rank < 4; ++rank)
    ranks.emplace_back([&, rank] {
      auto tensor_group = reducer_group::join(**node, grid.group_options(rank, "tensor"));
      auto data_group = reducer_group::join(**node, grid.group_options(rank, "data"));
      if (!tensor_group || !data_group) {
        ADD_FAILURE() << "rank " << rank << " could not join its groups";
        return;
      }
      parallel_gpt model(gpt_config, *tensor_group, {.sequence_parallel = true});
      auto dp = data_parallel::create(model.named_parameters(), *data_group);
      if (!dp) {
        ADD_FAILURE() << dp.error().message();
        return;
      }
      auto opt = adam()(model.named_parameters());
      auto ckpt = checkpoints::create(options_in(directory)).value();
      ckpt.track(model, *opt, *tensor_group, *dp);
      const auto replica = static_cast<std::int64_t>(grid.coordinate(rank, "data"));
      auto trained = resume_and_train(ckpt, until, [&](std::int64_t step) -> expected<double> {
        auto ids = gpt_ids(step, 0).narrow(0, replica, 1).contiguous();
        auto next = gpt_ids(step, 1).narrow(0, replica, 1).contiguous();
        auto logits = model(autograd::variable(ids));
        auto classes = logits.data().shape()[2];
        return replica_step(*dp, *opt,
                            vocab_parallel_cross_entropy(autograd::reshape(logits, {5, classes}), next.reshape({5}),
                                                         *tensor_group, gpt_vocabulary));
      });
      if (!trained)
        ADD_FAILURE() << "rank " << rank << ": " << trained.error().message();
      else
        losses[rank] = *trained;
    });
  for (auto& t : ranks)
    t.join();
  (*node)->stop();
  // Rank 0 and the other rank of its data group are tensor member 0 of the
  // two replicas: their halves' mean is the batch's loss.
  std::vector<double> out;
  const auto other = grid.group(0, "data").at(1);
  for (std::size_t i = 0; i < losses[0].size() && i < losses[other].size(); ++i)
    out.push_back((losses[0][i] + losses[other][i]) / 2);
  return out;
}

/// Steps (resumed) .. `until` of the GPT as a tensor x pipeline layout:
/// 2 stages x 2 tensor ranks at `places`, 2 micro-batches; the batch's mean loss.
std::vector<double> run_gpt_tensor_pipeline(const fs::path& directory, int until,
                                            std::vector<std::string> places = {"worker0/cpu", "worker0/cpu"}) {
  auto job = troupe::job::local().value();
  auto made = tensor_parallel_pipeline::create(
    job, {.tensor = 2,
          .model = [](reducer_group& group) {
            return std::make_shared<parallel_gpt>(gpt_config, group, tensor_parallel_options{.sequence_parallel = true});
          },
          .loss = [](reducer_group& group) -> loss_function {
            return [&group](const autograd::variable& logits, const tensor& targets) {
              const auto tokens = targets.numel(), classes = logits.data().shape()[2];
              return vocab_parallel_cross_entropy(autograd::reshape(logits, {tokens, classes}),
                                                  targets.reshape({tokens}), group, gpt_vocabulary);
            };
          },
          .pipeline = {.places = std::move(places), .micro_batches = 2, .optimizer = adam(),
                       .in_this_process = true}});
  if (!made) {
    ADD_FAILURE() << made.error().message();
    return {};
  }
  auto ckpt = checkpoints::create(job, options_in(directory)).value();
  ckpt.track(*made);
  auto trained = resume_and_train(ckpt, until, [&](std::int64_t step) {
    return made->train_step(gpt_ids(step, 0), gpt_ids(step, 1));
  });
  if (!trained)
    ADD_FAILURE() << "tensor x pipeline: " << trained.error().message();
  return trained ? *trained : std::vector<double>{};
}

/// The last checkpoints (step 6) under `a` and `b` hold the same tensors,
/// value by value, whoever wrote them.
void expect_same_last_checkpoint(const fs::path& a_root, const fs::path& b_root) {
  auto a = checkpoint_reader::open(checkpoint_path(a_root, last_step));
  auto b = checkpoint_reader::open(checkpoint_path(b_root, last_step));
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->manifest().tensors.size(), b->manifest().tensors.size());
  for (const auto& t : a->manifest().tensors) {
    auto x = a->read(t.name);
    auto y = b->read(t.name);
    ASSERT_TRUE(x && y) << t.name;
    EXPECT_TRUE(allclose(*y, *x, 1e-9, 1e-12)) << t.name;
  }
}

/// The GPT saved at step 3 by `layout` and resumed in one process, and
/// saved in one process and resumed by `layout`: both give the losses,
/// parameters and optimizer state of an uninterrupted run in one process.
void check_one_process_and_back(const fs::path& root, const std::string& layout_name,
                                const std::function<std::vector<double>(const fs::path&, int)>& layout) {
  const auto uninterrupted = root / "uninterrupted";
  const auto want = run_gpt(1, uninterrupted, last_step);
  ASSERT_EQ(want.size(), std::size_t(last_step));
  for (const bool layout_first : {true, false}) {
    const auto name = layout_first ? layout_name + " to one process" : "one process to " + layout_name;
    SCOPED_TRACE(name);
    const auto dir = root / name;
    auto run_one = [&](bool in_layout, int until) { return in_layout ? layout(dir, until) : run_gpt(1, dir, until); };
    const auto first = run_one(layout_first, saved_at);
    ASSERT_EQ(first.size(), std::size_t(saved_at));
    const auto second = run_one(!layout_first, last_step);
    ASSERT_EQ(second.size(), std::size_t(last_step - saved_at));
    for (int i = 0; i < saved_at; ++i)
      EXPECT_NEAR(first[i], want[i], 1e-10) << "step " << i + 1;
    for (int i = 0; i < last_step - saved_at; ++i)
      EXPECT_NEAR(second[i], want[saved_at + i], 1e-10) << "step " << saved_at + i + 1;
    expect_same_last_checkpoint(uninterrupted, dir);
  }
}

TEST_F(ScratchDirectory, TensorTimesDataMeshResumesInOneProcessAndBack) {
  check_one_process_and_back(directory_, "mesh", run_gpt_mesh);
}

TEST_F(ScratchDirectory, TensorParallelPipelineResumesInOneProcessAndBack) {
  check_one_process_and_back(directory_, "tensor x pipeline",
                             [](const fs::path& directory, int until) { return run_gpt_tensor_pipeline(directory, until); });
}

// The same with both stages' tensor ranks on cuda:0: their pieces and Adam's
// state are saved from the GPU and loaded back onto it.
TEST_F(ScratchDirectory, TensorParallelPipelineOnCudaResumesInOneProcessAndBack) {
  test::cuda_or_emulated devices(1);
  check_one_process_and_back(directory_, "tensor x pipeline on cuda:0", [](const fs::path& directory, int until) {
    return run_gpt_tensor_pipeline(directory, until, {"worker0/cuda:0", "worker0/cuda:0"});
  });
}

class TensorParallelResume : public ScratchDirectory,
                             public ::testing::WithParamInterface<std::pair<std::uint32_t, std::uint32_t>> {};

TEST_P(TensorParallelResume, AtAnotherDegreeGivesTheLossesOfAnUninterruptedRun) {
  const auto [saving, loading] = GetParam();
  fs::path uninterrupted = directory_ / "uninterrupted";
  const auto want = run_gpt(1, uninterrupted, last_step);
  ASSERT_EQ(want.size(), std::size_t(last_step));
  const auto first = run_gpt(saving, directory_ / "resumed", saved_at);
  ASSERT_EQ(first.size(), std::size_t(saved_at));
  const auto second = run_gpt(loading, directory_ / "resumed", last_step);
  ASSERT_EQ(second.size(), std::size_t(last_step - saved_at)) << "did degree " << loading << " resume at step 3?";
  for (int i = 0; i < saved_at; ++i)
    EXPECT_NEAR(first[i], want[i], 1e-10) << "step " << i + 1;
  for (int i = 0; i < last_step - saved_at; ++i)
    EXPECT_NEAR(second[i], want[saved_at + i], 1e-10) << "step " << saved_at + i + 1;
  // Parameters and optimizer state: the resumed run's last checkpoint holds
  // the uninterrupted run's, tensor by tensor.
  expect_same_last_checkpoint(uninterrupted, directory_ / "resumed");
}

INSTANTIATE_TEST_SUITE_P(Degrees, TensorParallelResume,
                         ::testing::Values(std::pair{1u, 2u}, std::pair{2u, 1u}, std::pair{2u, 3u}, std::pair{3u, 2u}),
                         [](const auto& info) {
                           return fmt::format("degree_{}_to_{}", info.param.first, info.param.second);
                         });

using CheckpointsTest = ScratchDirectory;

TEST_F(CheckpointsTest, AFreshDirectoryResumesAtStepZero) {
  tracked_mlp fresh(options_in(directory_));
  auto done = fresh.ckpt.resume();
  ASSERT_TRUE(done) << done.error().message();
  EXPECT_EQ(*done, 0);
}

TEST(CheckpointsOff, WithoutADirectoryNothingIsSavedAndResumeStartsAfresh) {
  tracked_mlp off({.every = 1});
  auto& ckpt = off.ckpt;
  ASSERT_TRUE(ckpt.save_if_due(1));
  ASSERT_TRUE(ckpt.save(2));
  ASSERT_TRUE(ckpt.wait());
  auto done = ckpt.resume();
  ASSERT_TRUE(done);
  EXPECT_EQ(*done, 0);
}

TEST_F(CheckpointsTest, AsynchronousSaveWritesTheValuesOfTheCallNotLaterOnes) {
  tracked_mlp one(options_in(directory_));
  train_step(*one.model, *one.opt, make_batch(1));
  auto at_save = one.model->state_dict();
  for (auto& [name, value] : at_save)
    value = value.clone();
  ASSERT_TRUE(one.ckpt.save(1));
  // Right after the call returns: the parameters change under the writer.
  for (auto& p : one.model->parameters())
    p.set_data(tensor::full(p.data().shape(), 123.0, dtype::float64));
  ASSERT_TRUE(one.ckpt.wait());
  auto reader = checkpoint_reader::open(checkpoint_path(directory_, 1));
  ASSERT_TRUE(reader) << reader.error().message();
  for (const auto& [name, value] : at_save) {
    auto saved = reader->read("model." + name);
    ASSERT_TRUE(saved) << saved.error().message();
    EXPECT_EQ(saved->to_vector<double>(), value.to_vector<double>()) << name;
  }
}

TEST_F(CheckpointsTest, APipelinesAsynchronousSaveHoldsItsStepWhileTheNextStepsRun) {
  // The stages copy their state on their writer threads while the next
  // steps' forward and backward run; the optimizer steps wait for the copy.
  auto losses = run({layout_kind::pipeline, {4, 8}, 1, "pipeline 3 stages"}, directory_, last_step);
  ASSERT_EQ(losses.size(), std::size_t(last_step));
  auto model = make_mlp();
  auto opt = adam()(model->named_parameters());
  for (int step = 1; step <= saved_at; ++step)
    train_step(*model, *opt, make_batch(step));
  auto reader = checkpoint_reader::open(checkpoint_path(directory_, saved_at));
  ASSERT_TRUE(reader) << reader.error().message();
  for (const auto& [name, value] : model->state_dict()) {
    auto saved = reader->read("model." + name);
    ASSERT_TRUE(saved) << saved.error().message();
    EXPECT_TRUE(allclose(*saved, value, 1e-12, 1e-12)) << name << " is not step 3's";
  }
  for (const auto& [name, value] : opt->state_dict()) {
    auto saved = reader->read("optimizer." + name);
    ASSERT_TRUE(saved) << saved.error().message();
    EXPECT_TRUE(allclose(*saved, value, 1e-12, 1e-12)) << name << " is not step 3's";
  }
}

TEST_F(CheckpointsTest, RandomStreamsAreSavedAndRestored) {
  tracked_mlp first(options_in(directory_));
  generator data{42};
  first.ckpt.track("data", data);
  (void)randn({5}, data);
  const auto position = data;
  ASSERT_TRUE(first.ckpt.save(1));
  ASSERT_TRUE(first.ckpt.wait());

  generator other{7};
  tracked_mlp again(options_in(directory_));
  again.ckpt.track("data", other);
  auto done = again.ckpt.resume();
  ASSERT_TRUE(done) << done.error().message();
  EXPECT_EQ(*done, 1);
  EXPECT_EQ(other.seed, position.seed);
  EXPECT_EQ(other.offset, position.offset);
}

/// Saves one process's model after step 1 into `directory`.
void save_one_step(const fs::path& directory) {
  tracked_mlp one(options_in(directory));
  train_step(*one.model, *one.opt, make_batch(1));
  ASSERT_TRUE(one.ckpt.save(1));
  ASSERT_TRUE(one.ckpt.wait());
}

TEST_F(CheckpointsTest, AnotherModelIsRefusedNamingTheFirstShapeThatDiffers) {
  save_one_step(directory_);
  tracked_mlp other(options_in(directory_), 8);
  const auto before = values_of(*other.model);
  auto done = other.ckpt.resume();
  ASSERT_FALSE(done);
  EXPECT_THAT(done.error().message(), HasSubstr("'model.0.weight' is float64 [16, 16] there but float64 [8, 8]"));
  EXPECT_EQ(values_of(*other.model), before);
}

TEST_F(CheckpointsTest, APipelineOfAnotherModelIsRefusedBeforeAnyStageLoads) {
  save_one_step(directory_);
  auto job = troupe::job::local().value();
  pipeline_options o;
  o.model = make_mlp(8);
  o.places = {"worker0/cpu", "worker0/cpu"};
  o.optimizer = adam();
  o.loss = mse_loss_function();
  o.in_this_process = true;
  auto pipe = pipeline::create(job, std::move(o));
  ASSERT_TRUE(pipe) << pipe.error().message();
  auto ckpt = checkpoints::create(job, options_in(directory_)).value();
  ckpt.track(*pipe);
  auto done = ckpt.resume();
  ASSERT_FALSE(done);
  EXPECT_THAT(done.error().message(), HasSubstr("'model.0.weight' is float64 [16, 16] there but float64 [8, 8]"));
  auto b = make_batch(1);
  EXPECT_TRUE(pipe->train_step(b.inputs.narrow(1, 0, 8).contiguous(), b.targets.narrow(1, 0, 8).contiguous()))
    << "a refused checkpoint must leave the pipeline usable";
}

TEST_F(CheckpointsTest, ADamagedShardIsAnErrorNamingFileAndTensorAndLoadsNothing) {
  save_one_step(directory_);
  // Flip one byte in the middle of the only shard file.
  auto step = checkpoint_path(directory_, 1);
  fs::path shard;
  for (const auto& entry : fs::directory_iterator(step))
    if (entry.path().extension() == ".shard")
      shard = entry.path();
  ASSERT_FALSE(shard.empty());
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    char c = 0;
    file.read(&c, 1);
    file.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    c = static_cast<char>(c ^ 0x5a);
    file.write(&c, 1);
  }
  tracked_mlp fresh(options_in(directory_));
  const auto before = values_of(*fresh.model); // differs from the saved step 1's
  auto done = fresh.ckpt.resume();
  ASSERT_FALSE(done);
  EXPECT_THAT(done.error().message(), HasSubstr("in file '" + shard.filename().string() + "'"));
  EXPECT_THAT(done.error().message(), HasSubstr("CRC32C"));
  EXPECT_THAT(done.error().message(), ::testing::MatchesRegex(".*tensor '(model|optimizer)\\..*"));
  EXPECT_EQ(values_of(*fresh.model), before) << "a damaged checkpoint changed the model";
  EXPECT_EQ(fresh.opt->step_count(), 0);
}

TEST_F(CheckpointsTest, ASaveCutShortLeavesThePreviousCheckpointToResumeFrom) {
  save_one_step(directory_);
  // A later save whose writer died mid-shard: its staging directory holds
  // a partial shard and no manifest.
  fs::create_directories(staging_path(directory_, 2));
  std::ofstream(staging_path(directory_, 2) / "rank-0.shard") << "partial";
  tracked_mlp resumed(options_in(directory_));
  auto done = resumed.ckpt.resume();
  ASSERT_TRUE(done) << done.error().message();
  EXPECT_EQ(*done, 1);
  EXPECT_EQ(resumed.opt->step_count(), 1);
}

// A run that died while saving step 2 after replica 1 had reported (its
// shard holds other values) but before the coordinator committed; the
// restarted run saves step 2 again, replica 1 late. The coordinator must
// wait for this run's report, not commit the dead run's shard (nor tidy
// away or rename the directory under the files replica 1 is still writing:
// its own rename then fails, "cannot rename ... step-N.tmp/...").
TEST_F(CheckpointsTest, ARestartedRunWaitsForItsOwnReportsNotTheDeadRunsLeftInStaging) {
  auto options = options_in(directory_);
  options.asynchronous = false;
  auto replicas = [&](const std::function<void(std::uint32_t, nn::module&, checkpoints&)>& body) {
    test::local_ring ring(2);
    ring.each([&](std::uint32_t k) {
      auto model = make_mlp();
      auto dp = data_parallel::create(model->named_parameters(), *ring.groups[k]);
      ASSERT_TRUE(dp) << dp.error().message();
      auto opt = adam()(model->named_parameters());
      auto ckpt = checkpoints::create(options).value();
      ckpt.track(*model, *opt, *dp);
      body(k, *model, ckpt);
    });
  };
  replicas([&](std::uint32_t k, nn::module& model, checkpoints& ckpt) {
    auto saved = ckpt.save(1);
    ASSERT_TRUE(saved) << saved.error().message();
    if (k == 1) { // the coordinator dies before it saves step 2
      for (auto& p : model.parameters())
        p.set_data(tensor::full(p.data().shape(), 7.0, dtype::float64));
      ASSERT_TRUE(ckpt.save(2));
    }
  });
  ASSERT_TRUE(fs::exists(staging_path(directory_, 2) / "data-parallel-0.replica-1.pieces"));

  std::barrier resumed(2); // as the first step's allreduce: every replica has resumed
  replicas([&](std::uint32_t k, nn::module&, checkpoints& ckpt) {
    auto done = ckpt.resume();
    ASSERT_TRUE(done) << done.error().message();
    EXPECT_EQ(*done, 1);
    resumed.arrive_and_wait();
    if (k == 1)
      std::this_thread::sleep_for(300ms);
    auto saved = ckpt.save(2);
    ASSERT_TRUE(saved) << "replica " << k << ": " << saved.error().message();
  });
  auto reader = checkpoint_reader::open(checkpoint_path(directory_, 2));
  ASSERT_TRUE(reader) << reader.error().message();
  for (const auto& [name, value] : make_mlp()->state_dict()) {
    auto saved = reader->read("model." + name);
    ASSERT_TRUE(saved) << saved.error().message();
    EXPECT_EQ(saved->to_vector<double>(), value.to_vector<double>()) << name << " is the dead run's";
  }
  EXPECT_FALSE(fs::exists(staging_path(directory_, 2)));
}

using CheckpointsDeathTest = ScratchDirectory;

// A process killed (SIGKILL) halfway through writing its shard of step 6:
// the child (a death test, re-executed so it starts with one thread) saves
// step 3, then sets TROUPE_CHECKPOINT_TEST_KILL_AFTER_BYTES to half its
// shard's size, so its shard writer kills it in the middle of step 6's
// shard. Step 3 must stay the latest checkpoint, resume from it must give
// the uninterrupted losses, and the next save must commit over the debris.
TEST_F(CheckpointsDeathTest, AProcessKilledInTheMiddleOfASaveLeavesThePreviousCheckpointToResumeFrom) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The re-executed child has another pid, hence another directory_: it
  // takes the parent's from the environment.
  const char* inherited = std::getenv("TROUPE_TEST_KILLED_SAVE_DIRECTORY");
  const fs::path directory = inherited != nullptr ? fs::path(inherited) : directory_;
  ::setenv("TROUPE_TEST_KILLED_SAVE_DIRECTORY", directory.c_str(), 1);
  const auto shard_of = [&](int step) { return directory / fmt::format("step-{}", step) / "rank-0.shard"; };
  auto child = [&] {
    tracked_mlp one(options_in(directory));
    for (int step = 1; step <= last_step; ++step) {
      train_step(*one.model, *one.opt, make_batch(step));
      if (!one.ckpt.save_if_due(step) || !one.ckpt.wait())
        std::_Exit(3);
      if (step == saved_at)
        ::setenv("TROUPE_CHECKPOINT_TEST_KILL_AFTER_BYTES", std::to_string(fs::file_size(shard_of(step)) / 2).c_str(),
                 1);
    }
    std::_Exit(0); // not reached: step 6's save kills the process
  };
  EXPECT_EXIT(child(), ::testing::KilledBySignal(SIGKILL), "");
  ::unsetenv("TROUPE_TEST_KILLED_SAVE_DIRECTORY");

  // What the kill left: step 3 committed, step 6 half written and uncommitted.
  ASSERT_TRUE(fs::exists(shard_of(saved_at)));
  const auto shard_bytes = fs::file_size(shard_of(saved_at));
  const auto partial = staging_path(directory, last_step) / "rank-0.shard.tmp";
  ASSERT_TRUE(fs::exists(partial)) << "the child was not killed while writing step " << last_step << "'s shard";
  EXPECT_EQ(fs::file_size(partial), shard_bytes / 2);
  EXPECT_FALSE(fs::exists(directory / fmt::format("step-{}", last_step)));
  auto latest = latest_checkpoint(directory);
  ASSERT_TRUE(latest && *latest);
  EXPECT_EQ((*latest)->filename(), fmt::format("step-{}", saved_at));

  // Resumed in this process: step 3's state, then the uninterrupted losses.
  tracked_mlp resumed(options_in(directory));
  auto losses = resume_and_train(resumed.ckpt, last_step, [&](std::int64_t step) -> expected<double> {
    return train_step(*resumed.model, *resumed.opt, make_batch(step));
  });
  ASSERT_TRUE(losses) << losses.error().message();
  ASSERT_EQ(losses->size(), static_cast<std::size_t>(last_step - saved_at));
  for (int step = saved_at + 1; step <= last_step; ++step)
    EXPECT_NEAR((*losses)[step - saved_at - 1], reference().losses[step - 1], 1e-10) << "step " << step;
  EXPECT_EQ(values_of(*resumed.model), values_of(*reference().model));
  EXPECT_TRUE(fs::exists(directory / fmt::format("step-{}", last_step) / "manifest"));
  EXPECT_FALSE(fs::exists(staging_path(directory, last_step)));
}

TEST_F(CheckpointsTest, AWriterThatNeverReportsIsNamedWhenTheCoordinatorGivesUp) {
  test::local_ring ring(2);
  std::optional<error> coordinator_error;
  ring.each([&](std::uint32_t k) {
    auto model = make_mlp();
    auto dp = data_parallel::create(model->named_parameters(), *ring.groups[k]);
    ASSERT_TRUE(dp) << dp.error().message();
    auto opt = adam()(model->named_parameters());
    auto o = options_in(directory_);
    o.asynchronous = false;
    o.timeout = 300ms;
    auto ckpt = checkpoints::create(o).value();
    ckpt.track(*model, *opt, *dp);
    if (k == 0) { // replica 1 never saves
      auto saved = ckpt.save(1);
      if (!saved)
        coordinator_error = saved.error();
    }
  });
  ASSERT_TRUE(coordinator_error.has_value()) << "the coordinator committed without replica 1";
  EXPECT_THAT(coordinator_error->message(), HasSubstr("no report from data-parallel-0.replica-1 within 300 ms"));
  auto latest = latest_checkpoint(directory_);
  ASSERT_TRUE(latest);
  EXPECT_FALSE(latest->has_value());
}

TEST_F(CheckpointsTest, AnUnwritableDirectoryIsReportedByTheNextCall) {
  fs::create_directories(directory_.parent_path());
  std::ofstream(directory_) << "a file where the directory should be";
  tracked_mlp one(options_in(directory_));
  auto& ckpt = one.ckpt;
  auto saved = ckpt.save(1); // asynchronous: the copy succeeds
  ASSERT_TRUE(saved) << saved.error().message();
  auto waited = ckpt.wait();
  ASSERT_FALSE(waited);
  EXPECT_THAT(waited.error().message(), HasSubstr(directory_.string()));
  fs::remove(directory_);
}

TEST(CheckpointsUsage, MistakesAreUsageErrorsNamingTheValue) {
  EXPECT_THROW((void)checkpoints::create({.directory = "/tmp/x", .every = -1}), usage_error);
  auto ckpt = checkpoints::create({.directory = "/tmp/troupe-unused"}).value();
  auto model = make_mlp();
  auto opt = adam()(model->named_parameters());
  ckpt.track(*model, *opt);
  EXPECT_THROW(ckpt.track(*model, *opt), usage_error); // one model of its own per process
  // Steps must increase.
  checkpoint_options o{.directory = fs::temp_directory_path() / fmt::format("troupe-usage-{}", ::getpid())};
  auto again = checkpoints::create(o).value();
  again.track(*model, *opt);
  ASSERT_TRUE(again.save(2));
  EXPECT_THROW((void)again.save(2), usage_error);
  ASSERT_TRUE(again.wait());
  fs::remove_all(o.directory);
}

// The coordinator is a rank of the job: by default rank 0, which may then
// track a model of its own (examples/check_parameter_server_demo.sh runs a
// job whose trainer 0, rank 2, coordinates).
TEST(CheckpointsUsage, TheCoordinatorMustBeARankOfTheJob) {
  auto job = troupe::job::local().value();
  try {
    (void)checkpoints::create(job, {.directory = "/tmp/troupe-unused", .coordinator = 1});
    ADD_FAILURE() << "coordinator 1 of a job of one rank was accepted";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("options.coordinator is rank 1 but the job has 1 ranks"));
  }
  auto ckpt = checkpoints::create(job, {.directory = "/tmp/troupe-unused"}).value();
  auto model = make_mlp();
  auto opt = adam()(model->named_parameters());
  ckpt.track(*model, *opt); // rank 0 coordinates by default
}

} // namespace
} // namespace troupe::parallel
