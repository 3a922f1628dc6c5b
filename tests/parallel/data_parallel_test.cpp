// Data parallelism (issue 5): gradient buckets; N replicas with batch b
// train exactly like one process with batch N·b (N = 2 and an odd ring of
// 3), end bitwise identical to each other, accumulate with
// set_final_pass(false), and a silent or killed replica fails the others
// with its name instead of hanging. Ranks run as threads on one node, and
// across processes (this binary re-executes itself as rank 1).
#include "troupe/parallel/data_parallel.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "emulated_device.hpp"
#include "ring_support.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/node.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::parallel;
using troupe::test::cluster;
using troupe::test::local_ring;
using troupe::test::places_for;
using troupe::test::start_cluster;
using ::testing::HasSubstr;

namespace {

/// Linear(6, 16) + GELU + Linear(16, 16) + ReLU + Linear(16, 3), float64.
std::shared_ptr<nn::sequential> make_model(std::uint64_t seed) {
  auto model = std::make_shared<nn::sequential>();
  auto linear = [](std::int64_t in, std::int64_t out) {
    nn::linear_options o;
    o.in_features = in;
    o.out_features = out;
    o.type = dtype::float64;
    return nn::make<nn::linear>(o);
  };
  model->append(linear(6, 16));
  model->append(nn::make<nn::gelu>());
  model->append(linear(16, 16));
  model->append(nn::make<nn::relu>());
  model->append(linear(16, 3));
  model->reset_parameters(seed);
  return model;
}

struct batch {
  tensor inputs;
  tensor targets;
};

batch make_batch(std::uint64_t step, std::int64_t rows) {
  generator gen{500 + step};
  return {randn({rows, 6}, gen, 0.0, 1.0, dtype::float64), randn({rows, 3}, gen, 0.0, 1.0, dtype::float64)};
}

batch shard(const batch& b, std::uint32_t rank, std::int64_t per_replica) {
  return {b.inputs.slice(0, rank * per_replica, (rank + 1) * per_replica).clone(),
          b.targets.slice(0, rank * per_replica, (rank + 1) * per_replica).clone()};
}

autograd::variable loss_of(nn::sequential& model, const batch& b) {
  return autograd::mse_loss(model.forward(autograd::variable(b.inputs)), autograd::variable(b.targets));
}

optim::sgd_options sgd() {
  optim::sgd_options o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return o;
}

/// (g++ 12 warns about designated initializers that omit fields.)
data_parallel_options dp_options(bucket_options buckets, bool broadcast = true) {
  data_parallel_options o;
  o.buckets = buckets;
  o.broadcast_parameters = broadcast;
  return o;
}

constexpr int steps = 3;
constexpr std::int64_t per_replica = 4;

/// One process, batch N·b: the parameters after `steps` steps.
std::vector<tensor> reference(std::uint32_t n) {
  auto model = make_model(11);
  optim::sgd opt(model->named_parameters(), sgd());
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    autograd::backward(loss_of(*model, make_batch(s, n * per_replica)));
    opt.step();
  }
  std::vector<tensor> out;
  for (auto& p : model->parameters())
    out.push_back(p.data().clone());
  return out;
}

bool bitwise_equal(const tensor& a, const tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void expect_close(const std::vector<tensor>& got, const std::vector<tensor>& want, const std::string& who) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    auto g = got[k].to_vector<double>();
    auto w = want[k].to_vector<double>();
    for (std::size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], w[i], 1e-12) << who << ", parameter " << k << ", element " << i;
  }
}

// ---- buckets ----------------------------------------------------------------

/// Each bucket's parameter names, in bucket order.
std::vector<std::vector<std::string>> bucket_names(const std::vector<gradient_bucket>& buckets,
                                                   const nn::named_variables& params) {
  std::vector<std::vector<std::string>> names;
  for (const auto& b : buckets) {
    names.emplace_back();
    for (const auto& s : b.slots)
      names.back().push_back(params[s.parameter].first);
  }
  return names;
}

TEST(GradientBuckets, ReverseOrderCapsAndDtypes) {
  auto model = make_model(1);
  auto params = model->named_parameters(); // 0.weight 0.bias 2.weight 2.bias 4.weight 4.bias
  // Float64: 4.bias 24 B, 4.weight 384 B, 2.bias 128 B, 2.weight 2048 B,
  // 0.bias 128 B, 0.weight 768 B.
  auto buckets = plan_buckets(params, {.bucket_bytes = 1024, .first_bucket_bytes = 400, .min_buckets = 1});
  auto names = bucket_names(buckets, params);
  using V = std::vector<std::vector<std::string>>;
  EXPECT_EQ(names, (V{{"4.bias"}, {"4.weight", "2.bias"}, {"2.weight"}, {"0.bias", "0.weight"}}));
  for (auto& b : buckets) {
    std::int64_t offset = 0;
    for (auto& s : b.slots) {
      EXPECT_EQ(s.offset, offset);
      offset += s.numel;
    }
    EXPECT_EQ(b.numel, offset);
  }
  // Default caps: one bucket of everything (3.4 KiB < 1 MiB, the first
  // bucket's cap, below which min_buckets never shrinks the cap).
  EXPECT_EQ(plan_buckets(params).size(), 1u);
}

TEST(GradientBuckets, ASmallModelIsStillSplitIntoAboutMinBuckets) {
  auto model = make_model(1);
  auto params = model->named_parameters(); // 3,480 bytes in all
  // Cap 1 MiB, but min_buckets 4: the cap shrinks to 3,480 / 4 = 870 bytes.
  auto buckets = plan_buckets(params, {.bucket_bytes = 1 << 20, .first_bucket_bytes = 100, .min_buckets = 4});
  auto names = bucket_names(buckets, params);
  using V = std::vector<std::vector<std::string>>;
  EXPECT_EQ(names, (V{{"4.bias"}, {"4.weight", "2.bias"}, {"2.weight"}, {"0.bias"}, {"0.weight"}}));
  // min_buckets 1: the plain cap, everything after the first bucket in one.
  EXPECT_EQ(plan_buckets(params, {.bucket_bytes = 1 << 20, .first_bucket_bytes = 100, .min_buckets = 1}).size(), 2u);
  try {
    plan_buckets(params, {.bucket_bytes = 1 << 20, .first_bucket_bytes = 100, .min_buckets = 0});
    FAIL() << "min_buckets 0 accepted";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("min_buckets is 0"));
  }
}

TEST(GradientBuckets, RefusesWhatTheReducersCannotAdd) {
  EXPECT_THROW(plan_buckets({}), usage_error);
  nn::named_variables halves{{"embedding.weight", autograd::variable(tensor::zeros({3}, dtype::bfloat16), true)}};
  try {
    plan_buckets(halves);
    FAIL() << "bfloat16 accepted";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("embedding.weight"));
  }
}

TEST(GradientBuckets, PackAndUnpackRoundTrip) {
  auto a = make_model(1), b = make_model(2);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (auto& bucket : plan_buckets(pa, {.bucket_bytes = 1024, .first_bucket_bytes = 400, .min_buckets = 1}))
    unpack_parameters(bucket, pack_parameters(bucket, pa), pb);
  for (std::size_t k = 0; k < pa.size(); ++k)
    EXPECT_TRUE(bitwise_equal(pa[k].second.data(), pb[k].second.data())) << pa[k].first;
}

// ---- replicas as threads ---------------------------------------------------

struct replica_result {
  std::vector<tensor> parameters;
  std::vector<data_parallel_stats> stats;
  std::string error;
};

/// N replicas train `steps` steps; every replica starts from a different
/// initialisation (seed 11 + rank): broadcasting rank 0's must fix that.
std::vector<replica_result> train_replicas(local_ring& ring, const bucket_options& buckets, int passes = 1) {
  const auto n = static_cast<std::uint32_t>(ring.groups.size());
  std::vector<replica_result> results(n);
  ring.each([&](std::uint32_t r) {
    auto model = make_model(11 + r);
    auto dp = data_parallel::create(model->named_parameters(), *ring.groups[r], dp_options(buckets));
    if (!dp) {
      results[r].error = dp.error().message();
      return;
    }
    optim::sgd opt(model->named_parameters(), sgd());
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto mine = shard(make_batch(s, n * per_replica), r, per_replica);
      // `passes` > 1: the shard in parts, accumulating locally until the last.
      const std::int64_t rows = per_replica / passes;
      for (int p = 0; p < passes; ++p) {
        dp->set_final_pass(p + 1 == passes);
        batch part{mine.inputs.slice(0, p * rows, (p + 1) * rows).clone(),
                   mine.targets.slice(0, p * rows, (p + 1) * rows).clone()};
        auto loss = loss_of(*model, part) * (1.0 / passes);
        if (p + 1 < passes) {
          autograd::backward(loss);
          continue;
        }
        if (auto ok = dp->backward(loss); !ok) {
          results[r].error = ok.error().message();
          return;
        }
      }
      results[r].stats.push_back(dp->last_stats());
      opt.step();
    }
    for (auto& p : model->parameters())
      results[r].parameters.push_back(p.data().clone());
  });
  return results;
}

class DataParallel : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(DataParallel, ReplicasEqualOneProcessWithTheWholeBatch) {
  const auto n = GetParam();
  local_ring ring(n, 64); // tiny chunks: many messages per bucket
  ASSERT_TRUE(ring.node);
  // Small caps: four buckets, reduced while backward runs.
  auto results = train_replicas(ring, {.bucket_bytes = 1024, .first_bucket_bytes = 400, .min_buckets = 1});
  auto want = reference(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    ASSERT_EQ(results[r].error, "") << "replica " << r;
    expect_close(results[r].parameters, want, "replica " + std::to_string(r));
    for (std::size_t k = 0; k < want.size(); ++k)
      EXPECT_TRUE(bitwise_equal(results[r].parameters[k], results[0].parameters[k]))
        << "replica " << r << " differs from replica 0 in parameter " << k;
    ASSERT_EQ(results[r].stats.size(), static_cast<std::size_t>(steps));
    EXPECT_EQ(results[r].stats.back().buckets, 4u);
    EXPECT_EQ(results[r].stats.back().bytes, 3480u); // 435 float64 gradients
  }
}

TEST_P(DataParallel, AccumulatingPassesEqualOneBackward) {
  const auto n = GetParam();
  local_ring ring(n);
  ASSERT_TRUE(ring.node);
  auto results = train_replicas(ring, {}, 2);
  auto want = reference(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    ASSERT_EQ(results[r].error, "") << "replica " << r;
    expect_close(results[r].parameters, want, "replica " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Ring, DataParallel, ::testing::Values(2u, 3u));

TEST(DataParallelUse, UnusedParameterGetsZeroGradientNotAHang) {
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  std::vector<tensor> grads(2);
  ring.each([&](std::uint32_t r) {
    auto model = make_model(3);
    auto params = model->named_parameters();
    // A parameter no forward uses: its hook never fires.
    params.emplace_back("unused", autograd::variable(tensor::ones({5}, dtype::float64), true));
    auto dp = data_parallel::create(params, *ring.groups[r]);
    ASSERT_TRUE(dp) << dp.error().message();
    auto ok = dp->backward(loss_of(*model, make_batch(r, 4)));
    ASSERT_TRUE(ok) << ok.error().message();
    grads[r] = params.back().second.grad().clone();
  });
  ASSERT_TRUE(grads[0].defined() && grads[1].defined());
  EXPECT_EQ(grads[0].to_vector<double>(), std::vector<double>(5, 0.0));
  EXPECT_TRUE(bitwise_equal(grads[0], grads[1]));
}

TEST(DataParallelUse, ReplicasOutliveTheGroupHandlesTheyWereMadeOn) {
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  std::vector<std::shared_ptr<nn::sequential>> models;
  std::vector<std::optional<data_parallel>> replicas(2);
  for (std::uint32_t r = 0; r < 2; ++r)
    models.push_back(make_model(3));
  ring.each([&](std::uint32_t r) {
    auto dp = data_parallel::create(models[r]->named_parameters(), *ring.groups[r]);
    ASSERT_TRUE(dp) << dp.error().message();
    replicas[r].emplace(std::move(*dp));
  });
  ASSERT_TRUE(replicas[0] && replicas[1]);
  ring.groups.clear(); // the handles go; each replica keeps its member of the ring
  std::vector<tensor> grads(2);
  std::vector<std::thread> steps;
  for (std::uint32_t r = 0; r < 2; ++r)
    steps.emplace_back([&, r] {
      auto ok = replicas[r]->backward(loss_of(*models[r], make_batch(r, 4)));
      ASSERT_TRUE(ok) << ok.error().message();
      EXPECT_EQ(replicas[r]->group().rank(), r);
      grads[r] = replicas[r]->parameters().front().second.grad().clone();
    });
  for (auto& t : steps)
    t.join();
  ASSERT_TRUE(grads[0].defined() && grads[1].defined());
  EXPECT_TRUE(bitwise_equal(grads[0], grads[1])) << "the replicas averaged through the ring";
}

/// A graph node whose backward throws, as a remote module's does when its
/// host is lost.
class lost_host_backward final : public autograd::node {
public:
  explicit lost_host_backward(const autograd::variable& input) { set_next_edges({autograd::gradient_edge(input)}); }
  std::vector<tensor> apply(std::vector<tensor>) override {
    throw std::runtime_error("remote module 'head' (worker1/cpu/module_head) was lost");
  }
  std::string name() const override { return "lost_host_backward"; }
};

TEST(DataParallelUse, ABackwardThatThrowsIsTheCallsErrorNotACrash) {
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  ring.each([&](std::uint32_t r) {
    auto model = make_model(3);
    auto dp = data_parallel::create(model->named_parameters(), *ring.groups[r]);
    ASSERT_TRUE(dp) << dp.error().message();
    auto b = make_batch(r, 4);
    auto y = model->forward(autograd::variable(b.inputs));
    auto through_host = autograd::variable::make_result(y.data().clone(), std::make_shared<lost_host_backward>(y));
    auto ok = dp->backward(autograd::mse_loss(through_host, autograd::variable(b.targets)));
    ASSERT_FALSE(ok);
    EXPECT_THAT(ok.error().message(), HasSubstr(fmt::format("replica {}: backward failed: remote module 'head'", r)));
  });
}

TEST(DataParallelUse, SecondBackwardWithoutSynchronizeIsAUsageError) {
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  ring.each([&](std::uint32_t r) {
    auto model = make_model(3);
    auto dp = data_parallel::create(model->named_parameters(), *ring.groups[r]);
    ASSERT_TRUE(dp) << dp.error().message();
    autograd::backward(loss_of(*model, make_batch(0, 4)));
    try {
      autograd::backward(loss_of(*model, make_batch(1, 4)));
      ADD_FAILURE() << "a second pass before synchronize() was accepted";
    } catch (const usage_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("set_final_pass(false)"));
    }
    EXPECT_TRUE(dp->synchronize()); // the first pass still reduces
  });
}

TEST(DataParallelFailure, SilentReplicaFailsTheOthersNamingIt) {
  auto model = make_model(3);
  {
    // Rank 0 never starts: rank 1 waits for its parameters at most the
    // group's timeout (1 s here), then names it.
    local_ring ring(2, 1024, 1000ms);
    ASSERT_TRUE(ring.node);
    auto start = std::chrono::steady_clock::now();
    auto dp = data_parallel::create(model->named_parameters(), *ring.groups[1]);
    ASSERT_FALSE(dp);
    EXPECT_THAT(dp.error().message(), HasSubstr("replica 0 (worker0/cpu/reducer0)"));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  }
  local_ring ring(2, 1024, 1000ms);
  ASSERT_TRUE(ring.node);
  // Rank 1 never reduces: rank 0's first bucket cannot complete.
  auto dp = data_parallel::create(model->named_parameters(), *ring.groups[0], dp_options({}, false));
  ASSERT_TRUE(dp);
  auto ok = dp->backward(loss_of(*model, make_batch(0, 4)));
  ASSERT_FALSE(ok);
  EXPECT_THAT(ok.error().message(), HasSubstr("replica 1 (worker0/cpu/reducer1)"));
  EXPECT_THAT(ok.error().message(), HasSubstr("bucket 0"));
  // The object refuses to go on (its replicas are out of step).
  EXPECT_FALSE(dp->synchronize());
}

// ---- CUDA: buckets on the device, reduced by NCCL ---------------------------

TEST(DataParallelCuda, TwoReplicasAverageDeviceGradientsWithNccl) {
#ifndef TROUPE_HAVE_NCCL
  GTEST_SKIP() << "no NCCL in this build";
#else
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "no CUDA device: needs 2, found " << cuda_device_count() << " (" << cuda_unavailable_reason()
                 << ")";
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  std::vector<std::vector<float>> got(2);
  ring.each([&](std::uint32_t r) {
    const auto gpu = device::cuda(static_cast<std::int32_t>(r));
    nn::named_variables params{
      {"weight", autograd::variable(tensor::full({300, 7}, r + 1.0, dtype::float32).to(gpu), true)},
      {"bias", autograd::variable(tensor::full({7}, r + 1.0, dtype::float32).to(gpu), true)}};
    auto dp = data_parallel::create(params, *ring.groups[r], dp_options({.bucket_bytes = 4096}));
    ASSERT_TRUE(dp) << dp.error().message();
    EXPECT_EQ(dp->reduction(), device_reduction::nccl) << "each replica has a GPU of its own";
    // Rank 0's parameters reached rank 1.
    EXPECT_EQ(params[0].second.data().to(device::cpu()).to_vector<float>(), std::vector<float>(2100, 1.0f));
    for (auto& [name, p] : params)
      p.set_grad(tensor::full(p.shape(), 10.0 * (r + 1), dtype::float32).to(gpu));
    auto ok = dp->synchronize(); // no backward: every slot is packed here
    ASSERT_TRUE(ok) << ok.error().message();
    for (auto& [name, p] : params) {
      EXPECT_EQ(p.grad().where(), gpu);
      auto values = p.grad().to(device::cpu()).to_vector<float>();
      got[r].insert(got[r].end(), values.begin(), values.end());
    }
  });
  EXPECT_EQ(got[0], std::vector<float>(2107, 15.0f));
  EXPECT_EQ(got[0], got[1]);
#endif
}

// Replicas on GPUs of their own choose NCCL by themselves. With two GPUs
// TwoReplicasAverageDeviceGradientsWithNccl above shows it; on the emulated
// device (two ordinals, no NCCL behind them) create() fails in NCCL's set-up,
// naming it.
TEST(DataParallelCuda, ReplicasOnGpusOfTheirOwnChooseNccl) {
#ifndef TROUPE_HAVE_NCCL
  GTEST_SKIP() << "this build has no NCCL: replicas on GPUs of their own reduce through the host";
#else
  const test::cuda_or_emulated devices(2);
  if (!devices.emulated())
    GTEST_SKIP() << "a real device: TwoReplicasAverageDeviceGradientsWithNccl shows the choice";
  local_ring ring(2, 1024, 2000ms);
  ASSERT_TRUE(ring.node);
  std::vector<std::string> errors(2);
  ring.each([&](std::uint32_t r) {
    auto replica = make_model(11);
    replica->to(device::cuda(static_cast<std::int32_t>(r)));
    auto dp = data_parallel::create(replica->named_parameters(), *ring.groups[r]);
    errors[r] = dp ? "created" : dp.error().message();
  });
  for (std::uint32_t r = 0; r < 2; ++r)
    EXPECT_THAT(errors[r], HasSubstr("nccl_communicator")) << "replica " << r;
#endif
}

// Two replicas on one GPU choose the host ring by themselves (the default,
// device_reduction::automatic) and train like one process on that GPU.
TEST(DataParallelCuda, ReplicasSharingOneGpuChooseTheHostRingAndEqualOneProcess) {
  // Without a device: on an emulated one (host memory, the CPU's kernels),
  // which checks where buckets and gradients go, not CUDA.
  const test::cuda_or_emulated devices(1);
  const auto gpu = device::cuda(0);
  constexpr std::uint32_t n = 2;
  auto on_gpu = [&](const batch& b) { return batch{b.inputs.to(gpu), b.targets.to(gpu)}; };
  // One process on the GPU, batch n·b.
  std::vector<tensor> want;
  {
    auto model = make_model(11);
    model->to(gpu);
    optim::sgd opt(model->named_parameters(), sgd());
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      autograd::backward(loss_of(*model, on_gpu(make_batch(s, n * per_replica))));
      opt.step();
    }
    for (auto& p : model->parameters())
      want.push_back(p.data().to(device::cpu()));
  }
  local_ring ring(n);
  ASSERT_TRUE(ring.node);
  std::vector<std::vector<tensor>> got(n);
  std::vector<std::string> errors(n);
  ring.each([&](std::uint32_t r) {
    auto replica = make_model(11 + r); // rank 0's values must be broadcast
    replica->to(gpu);
    auto options = dp_options({.bucket_bytes = 1024, .first_bucket_bytes = 400, .min_buckets = 1});
    auto dp = data_parallel::create(replica->named_parameters(), *ring.groups[r], options);
    if (!dp) {
      errors[r] = dp.error().message();
      return;
    }
    if (dp->reduction() != device_reduction::host_ring)
      errors[r] = "replicas sharing cuda:0 chose NCCL";
    optim::sgd opt(replica->named_parameters(), sgd());
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto mine = on_gpu(shard(make_batch(s, n * per_replica), r, per_replica));
      if (auto ok = dp->backward(loss_of(*replica, mine)); !ok) {
        errors[r] = ok.error().message();
        return;
      }
      opt.step();
    }
    for (auto& p : replica->parameters()) {
      if (p.data().where() != gpu)
        errors[r] = fmt::format("a parameter left the GPU: {}", p.data().where());
      got[r].push_back(p.data().to(device::cpu()));
    }
  });
  for (std::uint32_t r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "replica " << r;
    expect_close(got[r], want, fmt::format("replica {}", r));
  }
  for (std::size_t k = 0; k < got[0].size(); ++k)
    EXPECT_TRUE(bitwise_equal(got[0][k], got[1][k])) << "parameter " << k << " differs between the replicas";
}

// ---- across processes -------------------------------------------------------

/// Rank r of a cross-process run: trains and prints its parameters' bytes
/// as hex on one line, so the parent compares bitwise.
std::string train_as_process(reducer_group& group, std::uint32_t n) {
  auto model = make_model(11 + group.rank());
  auto dp = data_parallel::create(model->named_parameters(), group,
                                  dp_options({.bucket_bytes = 1024, .first_bucket_bytes = 400, .min_buckets = 1}));
  if (!dp)
    return "ERROR " + dp.error().message();
  optim::sgd opt(model->named_parameters(), sgd());
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto mine = shard(make_batch(s, n * per_replica), group.rank(), per_replica);
    if (auto ok = dp->backward(loss_of(*model, mine)); !ok)
      return "ERROR " + ok.error().message();
    opt.step();
  }
  std::string hex;
  for (auto& p : model->parameters()) {
    auto* bytes = static_cast<const unsigned char*>(p.data().raw_data());
    for (std::size_t i = 0; i < p.data().nbytes(); ++i)
      hex += fmt::format("{:02x}", bytes[i]);
  }
  return "PARAMS " + hex;
}

int run_child(int argc, char** argv) {
  auto options = actors::node_options::from(argc, argv);
  if (!options)
    return 2;
  auto started = actors::node::start(*options);
  if (!started)
    return 3;
  {
    auto n = (*started)->options().world_size;
    auto group = reducer_group::join(**started, {.rank = (*started)->rank(), .places = places_for(n),
                                                 .timeout = 10000ms});
    std::printf("%s\n", group ? "READY" : ("JOIN ERROR " + group.error().message()).c_str());
    std::fflush(stdout);
    if (group && std::string_view(argv[1]) == "--dp-child") {
      std::printf("%s\n", train_as_process(*group, n).c_str());
      std::fflush(stdout);
    }
    char byte;
    while (read(0, &byte, 1) > 0) {
    }
  }
  (*started)->stop();
  return 0;
}

TEST(DataParallelCrossProcess, TwoProcessesEqualOneAndEachOther) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, 2, "--dp-child"));
  auto group = reducer_group::join(*c.coordinator, {.rank = 0, .places = places_for(2), .timeout = 10000ms});
  ASSERT_TRUE(group) << group.error().message();
  auto mine = train_as_process(*group, 2);
  ASSERT_THAT(mine, ::testing::StartsWith("PARAMS ")) << mine;
  ASSERT_TRUE(c.workers[0].wait_for("PARAMS ", 20s)) << c.workers[0].output();
  // The child's line, bitwise equal to ours ...
  ASSERT_TRUE(c.workers[0].wait_for(mine, 5s)) << "replica 1's parameters differ from replica 0's";
  // ... and ours equal to one process with the whole batch.
  // (numerically: one process sums the batch in another order)
  auto want = reference(2);
  std::vector<tensor> got;
  {
    std::size_t at = 7;
    for (auto& t : want) {
      auto chunk = mine.substr(at, t.nbytes() * 2);
      at += chunk.size();
      std::vector<double> values(static_cast<std::size_t>(t.numel()));
      for (std::size_t i = 0; i < t.nbytes(); ++i)
        reinterpret_cast<unsigned char*>(values.data())[i] =
          static_cast<unsigned char>(std::stoi(chunk.substr(i * 2, 2), nullptr, 16));
      got.push_back(tensor::from(std::span<const double>(values), t.shape()));
    }
  }
  expect_close(got, want, "process 0");
}

TEST(DataParallelCrossProcess, KilledReplicaFailsNamingIt) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, 2, "--dp-idle"));
  auto group = reducer_group::join(*c.coordinator, {.rank = 0, .places = places_for(2), .timeout = 3000ms});
  ASSERT_TRUE(group) << group.error().message();
  ASSERT_TRUE(c.workers[0].wait_for("READY", 10s)) << c.workers[0].output();
  auto model = make_model(3);
  auto dp = data_parallel::create(model->named_parameters(), *group, dp_options({}, false));
  ASSERT_TRUE(dp);
  c.workers[0].signal(SIGKILL);
  auto start = std::chrono::steady_clock::now();
  auto ok = dp->backward(loss_of(*model, make_batch(0, 4)));
  ASSERT_FALSE(ok);
  EXPECT_THAT(ok.error().message(), HasSubstr("replica 1 (worker1/cpu/reducer1)"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string_view(argv[1]) == "--dp-child" || std::string_view(argv[1]) == "--dp-idle"))
    return run_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
