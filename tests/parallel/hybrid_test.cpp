// Hybrid parallelism (issue 5): 2 stages x 2 replicas. Each replica is a
// pipeline over its own shard of the batch; stage s of both replicas
// averages its gradients through its own reducer ring. Training matches one
// process with the whole batch, and the replicas of a stage stay equal; in
// one process (four stages on one node) and over four processes (one stage
// each, this binary re-executed as workers 1-3). A killed stage process ends
// every replica's step with an error naming it.
#include "troupe/parallel/hybrid.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include "ring_support.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::parallel;
using troupe::test::cluster;
using troupe::test::start_cluster;
using ::testing::HasSubstr;

namespace {

/// 4 x (Linear(16, 16) + ReLU), float64: 8 layers, two stages of four.
std::shared_ptr<nn::sequential> make_mlp() {
  auto model = std::make_shared<nn::sequential>();
  for (int i = 0; i < 4; ++i) {
    nn::linear_options o;
    o.in_features = 16;
    o.out_features = 16;
    o.type = dtype::float64;
    model->append(nn::make<nn::linear>(o));
    model->append(nn::make<nn::relu>());
  }
  model->reset_parameters(5);
  return model;
}

stage_recipe recipe() { return {make_mlp, sgd_factory({.lr = 0.05, .momentum = 0.9}), mse_loss_function()}; }

struct batch {
  tensor inputs;
  tensor targets;
};

batch make_batch(std::uint64_t step) {
  generator gen{300 + step};
  return {randn({12, 16}, gen, 0.0, 1.0, dtype::float64), randn({12, 16}, gen, 0.0, 1.0, dtype::float64)};
}

double digest(const std::vector<autograd::variable>& parameters) {
  double sum = 0;
  for (const auto& p : parameters)
    for (double v : p.data().to_vector<double>())
      sum += v + v * v;
  return sum;
}

constexpr int steps = 3;

/// One process, the whole batch: per-step losses and the digests of the
/// two stages' parameters (layers [0, 4) and [4, 8)).
std::pair<std::vector<double>, std::vector<double>> reference() {
  auto model = make_mlp();
  auto opt = recipe().optimizer(model->named_parameters());
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    auto b = make_batch(s);
    auto loss = autograd::mse_loss(model->forward(autograd::variable(b.inputs)), autograd::variable(b.targets));
    autograd::backward(loss);
    opt->step();
    opt->zero_grad();
    losses.push_back(loss.item());
  }
  return {losses, {digest(model->slice(0, 4)->parameters()), digest(model->slice(4, 8)->parameters())}};
}

hybrid_options layout(std::vector<std::vector<std::string>> places, schedule_kind schedule, std::size_t m) {
  hybrid_options o;
  o.recipe = recipe();
  o.places = std::move(places);
  o.pipeline.schedule = schedule;
  o.pipeline.micro_batches = m;
  o.pipeline.timeout = 10s;
  o.bucket_bytes = 1024; // several buckets per stage
  return o;
}

void train_and_compare(actors::node& node, hybrid_options options) {
  const bool overlap = options.pipeline.overlap_update;
  auto hybrid = hybrid_pipeline::create(node, std::move(options));
  ASSERT_TRUE(hybrid) << hybrid.error().message();
  auto [want_losses, want_digests] = reference();
  for (int s = 0; s < steps; ++s) {
    auto b = make_batch(s);
    auto loss = hybrid->train_step(b.inputs, b.targets);
    ASSERT_TRUE(loss) << loss.error().message();
    EXPECT_NEAR(*loss, want_losses[s], 1e-12) << "step " << s;
  }
  if (overlap) {
    ASSERT_TRUE(hybrid->synchronize()); // parameter_digests would wait too
  }
  auto r0 = hybrid->replica(0).parameter_digests();
  auto r1 = hybrid->replica(1).parameter_digests();
  ASSERT_TRUE(r0 && r1);
  for (std::size_t st = 0; st < 2; ++st) {
    EXPECT_NEAR((*r0)[st], want_digests[st], 1e-9 * std::abs(want_digests[st])) << "stage " << st;
    EXPECT_EQ((*r0)[st], (*r1)[st]) << "the replicas of stage " << st << " differ";
  }
}

class HybridInProcess : public ::testing::TestWithParam<std::pair<schedule_kind, std::size_t>> {};

TEST_P(HybridInProcess, TwoByTwoEqualsOneProcess) {
  auto node = troupe::test::start_local_node();
  ASSERT_TRUE(node) << node.error().message();
  register_stage_factory(**node, recipe());
  const auto [schedule, m] = GetParam();
  train_and_compare(**node, layout({{"worker0/cpu", "worker0/cpu"}, {"worker0/cpu", "worker0/cpu"}}, schedule, m));
  (*node)->stop();
}

TEST(HybridInProcessOverlapped, TwoByTwoEqualsOneProcessWithUpdatesOverlappingTheNextStep) {
  auto node = troupe::test::start_local_node();
  ASSERT_TRUE(node) << node.error().message();
  register_stage_factory(**node, recipe());
  auto o = layout({{"worker0/cpu", "worker0/cpu"}, {"worker0/cpu", "worker0/cpu"}}, schedule_kind::one_f_one_b, 3);
  o.pipeline.overlap_update = true;
  train_and_compare(**node, std::move(o));
  (*node)->stop();
}

INSTANTIATE_TEST_SUITE_P(Schedules, HybridInProcess,
                         ::testing::Values(std::pair{schedule_kind::gpipe, std::size_t{1}},
                                           std::pair{schedule_kind::one_f_one_b, std::size_t{3}},
                                           std::pair{schedule_kind::gpipe, std::size_t{2}}));

TEST(HybridLayout, RefusesUnevenLayouts) {
  auto node = troupe::test::start_local_node();
  ASSERT_TRUE(node) << node.error().message();
  register_stage_factory(**node, recipe());
  EXPECT_THROW((void)hybrid_pipeline::create(**node, layout({{"worker0/cpu", "worker0/cpu"}}, schedule_kind::gpipe, 1)),
               usage_error);
  try {
    (void)hybrid_pipeline::create(**node, layout({{"worker0/cpu", "worker0/cpu"}, {"worker0/cpu"}},
                                                 schedule_kind::gpipe, 1));
    ADD_FAILURE() << "a replica with one stage fewer was accepted";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("replica 1 has 1 stage places but the pipeline has 2 stages"));
  }
  auto hybrid =
    hybrid_pipeline::create(**node, layout({{"worker0/cpu", "worker0/cpu"}, {"worker0/cpu", "worker0/cpu"}},
                                           schedule_kind::gpipe, 1));
  ASSERT_TRUE(hybrid) << hybrid.error().message();
  auto b = make_batch(0);
  EXPECT_THROW((void)hybrid->train_step(b.inputs.slice(0, 0, 5), b.targets.slice(0, 0, 5)), usage_error);
  { auto stopped = std::move(*hybrid); } // the stages stop before the node
  (*node)->stop();
}

// ---- four processes -----------------------------------------------------------

int run_child(int argc, char** argv) {
  return test::serve_as_child_node(argc, argv, [](actors::node& node) {
    register_stage_factory(node, recipe());
    return std::function<void()>{};
  });
}

void start_four(cluster& c) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, 4, "--hybrid-child"));
  register_stage_factory(*c.coordinator, recipe());
  for (auto& w : c.workers)
    ASSERT_TRUE(w.wait_for("READY", 15s)) << w.output();
}

TEST(HybridCrossProcess, TwoStagesTimesTwoReplicasOverFourProcesses) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_four(c));
  // Replica 0: stages on workers 0 and 1; replica 1: on workers 2 and 3.
  train_and_compare(*c.coordinator,
                    layout({{"worker0/cpu", "worker1/cpu"}, {"worker2/cpu", "worker3/cpu"}}, schedule_kind::one_f_one_b, 2));
}

TEST(HybridCrossProcess, KilledStageProcessFailsEveryReplicaNamingIt) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_four(c));
  auto o = layout({{"worker0/cpu", "worker1/cpu"}, {"worker2/cpu", "worker3/cpu"}}, schedule_kind::gpipe, 2);
  o.pipeline.timeout = 3s;
  auto hybrid = hybrid_pipeline::create(*c.coordinator, std::move(o));
  ASSERT_TRUE(hybrid) << hybrid.error().message();
  auto b = make_batch(0);
  ASSERT_TRUE(hybrid->train_step(b.inputs, b.targets));
  c.workers[2].signal(SIGKILL); // worker3: replica 1's stage 1
  auto start = std::chrono::steady_clock::now();
  auto loss = hybrid->train_step(b.inputs, b.targets);
  ASSERT_FALSE(loss);
  EXPECT_THAT(loss.error().message(), HasSubstr("worker3"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  { auto stopped = std::move(*hybrid); } // the stages stop before the node
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "--hybrid-child")
    return run_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
