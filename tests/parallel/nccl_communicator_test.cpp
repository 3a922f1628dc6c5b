// The NCCL communicator of the reducer ring (nccl_communicator.hpp): ranks
// as threads in one process (as Gloo's tests run them), each on its own GPU,
// the NCCL unique id exchanged over the actor ring; results against a
// float64 reference computed here.
//
// Tests that need GPUs skip, visibly, when this machine has too few; the
// *WithoutADevice* test runs everywhere: asking for a device that is not
// there is an error value naming it, not a crash or a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>

#include "troupe/tensor/cuda.hpp"

#ifndef TROUPE_HAVE_NCCL

TEST(NcclCommunicator, NotInThisBuild) {
  GTEST_SKIP() << "this build has no NCCL communicator (configured without the CUDA toolkit and NCCL, or with "
                  "TROUPE_CUDA=OFF)";
}

#else

#include "ring_support.hpp"
#include "troupe/parallel/nccl_communicator.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::parallel;
using troupe::test::local_ring;
using ::testing::HasSubstr;

namespace {

/// Rank r's input: small integers plus a fraction (exact float32 sums).
float value(std::uint32_t rank, std::int64_t i) {
  return static_cast<float>((i * 7 + rank * 13) % 23) + 0.1f * static_cast<float>(rank + 1);
}

tensor input(std::uint32_t rank, std::int64_t count, dtype type) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    v[static_cast<std::size_t>(i)] = value(rank, i);
  return tensor::from(v, {count}).to(type);
}

double reference_sum(std::uint32_t n, std::int64_t i) {
  double sum = 0;
  for (std::uint32_t r = 0; r < n; ++r)
    sum += static_cast<double>(value(r, i));
  return sum;
}

/// One communicator per rank of `ring`, rank k on cuda:k, created
/// concurrently (joining waits for every member).
std::vector<std::optional<nccl_communicator>> communicators(local_ring& ring) {
  std::vector<std::optional<nccl_communicator>> made(ring.groups.size());
  ring.each([&](std::uint32_t k) {
    auto c = nccl_communicator::create(*ring.groups[k], {.where = device::cuda(static_cast<std::int32_t>(k)),
                                                         .timeout = 30000ms});
    if (c)
      made[k].emplace(std::move(*c));
    else
      ADD_FAILURE() << "rank " << k << ": " << c.error().message();
  });
  return made;
}

/// Destroys the communicators as they were made: concurrently, one thread
/// per rank (finalizing waits for every rank).
void destroy(local_ring& ring, std::vector<std::optional<nccl_communicator>>& comms) {
  ring.each([&](std::uint32_t k) { comms[k].reset(); });
}

TEST(NcclCommunicator, WithoutADeviceCreateIsAnErrorNamingIt) {
  // One ordinal past this machine's devices: runs with or without a GPU.
  const auto missing = cuda_device_count();
  local_ring ring(2);
  ASSERT_TRUE(ring.node);
  ring.each([&](std::uint32_t k) {
    auto where = device::cuda(missing + static_cast<std::int32_t>(k));
    auto c = nccl_communicator::create(*ring.groups[k], {.where = where, .timeout = 2000ms});
    ASSERT_FALSE(c) << "rank " << k;
    EXPECT_EQ(c.error().code(), errc::invalid_argument);
    EXPECT_THAT(c.error().message(), HasSubstr(fmt::format("{} is not available", where)));
  });
  ring.each([&](std::uint32_t k) {
    auto c = nccl_communicator::create(*ring.groups[k], {.where = device::cpu(), .timeout = 2000ms});
    ASSERT_FALSE(c) << "rank " << k;
    EXPECT_THAT(c.error().message(), HasSubstr("cpu is not a CUDA device"));
  });
}

TEST(NcclCommunicator, OneRankChecksItsTensors) {
  if (cuda_device_count() < 1)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  local_ring ring(1);
  ASSERT_TRUE(ring.node);
  auto comms = communicators(ring);
  ASSERT_TRUE(comms[0]);
  EXPECT_EQ(comms[0]->size(), 1u);
  auto on_cpu = input(0, 8, dtype::float32);
  auto wrong = comms[0]->allreduce(on_cpu);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code(), errc::invalid_argument);
  EXPECT_THAT(wrong.error().message(), HasSubstr("contiguous tensor on cuda:0"));
  auto strided = input(0, 12, dtype::float32).view({3, 4}).to(device::cuda(0)).t();
  EXPECT_FALSE(comms[0]->allreduce(strided));
  // One rank: every collective is the identity.
  auto data = on_cpu.to(device::cuda(0));
  ASSERT_TRUE(comms[0]->allreduce(data, reduce_op::average));
  EXPECT_TRUE(allclose(data, on_cpu, 0.0, 0.0));
  destroy(ring, comms);
}

/// Two ranks as threads, rank k on cuda:k, their communicators made
/// before each test and destroyed after it.
class NcclTwoRanks : public ::testing::Test {
protected:
  static constexpr std::uint32_t n = 2;

  void SetUp() override {
    if (cuda_device_count() < 2)
      GTEST_SKIP() << "needs two CUDA devices, this machine has " << cuda_device_count()
                   << (cuda_device_count() == 0 ? ": " + cuda_unavailable_reason() : std::string());
    ring_ = std::make_unique<local_ring>(n);
    ASSERT_TRUE(ring_->node);
    comms_ = communicators(*ring_);
    ASSERT_TRUE(comms_[0] && comms_[1]);
  }
  void TearDown() override {
    if (ring_)
      destroy(*ring_, comms_);
  }

  std::unique_ptr<local_ring> ring_;
  std::vector<std::optional<nccl_communicator>> comms_;
};

TEST_F(NcclTwoRanks, AllreduceSumAndAverageMatchTheReference) {
  for (auto type : {dtype::float32, dtype::float64})
    for (auto op : {reduce_op::sum, reduce_op::average})
      for (std::int64_t count : {1, 7, 4099, (1 << 20) / 4}) {
        std::vector<tensor> data(n);
        ring_->each([&](std::uint32_t k) {
          data[k] = input(k, count, type).to(device::cuda(static_cast<std::int32_t>(k)));
          auto ok = comms_[k]->allreduce(data[k], op);
          EXPECT_TRUE(ok) << "rank " << k << ": " << (ok ? "" : ok.error().message());
        });
        for (std::uint32_t k = 0; k < n; ++k) {
          auto got = data[k].to_vector<double>();
          for (std::int64_t i = 0; i < count; ++i) {
            auto want = reference_sum(n, i) / (op == reduce_op::average ? n : 1);
            ASSERT_NEAR(got[static_cast<std::size_t>(i)], want, 1e-5 * want)
              << "rank " << k << " element " << i << " of " << count << " " << name_of(type);
          }
        }
      }
}

TEST_F(NcclTwoRanks, ReduceScatterAllGatherAndBroadcast) {
  const std::int64_t count = 1000;
  std::vector<tensor> scattered(n), gathered(n), broadcasted(n);
  ring_->each([&](std::uint32_t k) {
    const auto gpu = device::cuda(static_cast<std::int32_t>(k));
    auto rs = comms_[k]->reduce_scatter(input(k, count, dtype::float32).to(gpu));
    ASSERT_TRUE(rs) << rs.error().message();
    scattered[k] = *rs;
    auto ag = comms_[k]->all_gather(input(k, count, dtype::float32).to(gpu));
    ASSERT_TRUE(ag) << ag.error().message();
    gathered[k] = *ag;
    broadcasted[k] = input(k, count, dtype::float32).to(gpu);
    auto bc = comms_[k]->broadcast(broadcasted[k], 1);
    ASSERT_TRUE(bc) << bc.error().message();
  });
  for (std::uint32_t k = 0; k < n; ++k) {
    ASSERT_EQ(scattered[k].numel(), count / n);
    auto block = scattered[k].to_vector<double>();
    for (std::int64_t i = 0; i < count / n; ++i)
      ASSERT_NEAR(block[static_cast<std::size_t>(i)], reference_sum(n, k * (count / n) + i), 1e-4) << "rank " << k;
    auto all = gathered[k].to_vector<float>();
    ASSERT_EQ(all.size(), static_cast<std::size_t>(count * n));
    for (std::uint32_t r = 0; r < n; ++r)
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(all[static_cast<std::size_t>(r * count + i)], value(r, i)) << "rank " << k;
    EXPECT_TRUE(allclose(broadcasted[k], input(1, count, dtype::float32), 0.0, 0.0)) << "rank " << k;
  }
}

TEST_F(NcclTwoRanks, AllreduceWaitsForTheWritesOfTheThreadThatMadeItsInput) {
  // The inputs are made by this thread and handed to the ranks' threads
  // while the kernels that write them may still be queued: NCCL, on a
  // stream of its own, must still read what they write.
  const std::int64_t count = 4099;
  std::vector<tensor> data(n);
  for (std::uint32_t k = 0; k < n; ++k)
    data[k] = mul(input(k, count, dtype::float32).to(device::cuda(static_cast<std::int32_t>(k))), 2.0);
  ring_->each([&](std::uint32_t k) {
    auto ok = comms_[k]->allreduce(data[k]);
    EXPECT_TRUE(ok) << "rank " << k << ": " << (ok ? "" : ok.error().message());
  });
  for (std::uint32_t k = 0; k < n; ++k) {
    auto got = data[k].to_vector<double>();
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_NEAR(got[static_cast<std::size_t>(i)], 2.0 * reference_sum(n, i), 1e-5 * reference_sum(n, i))
        << "rank " << k << " element " << i;
  }
}

TEST_F(NcclTwoRanks, ReduceScatterOfAnUnevenCountIsAnError) {
  auto odd = input(0, 7, dtype::float32).to(device::cuda(0));
  auto got = comms_[0]->reduce_scatter(odd);
  ASSERT_FALSE(got);
  EXPECT_THAT(got.error().message(), HasSubstr("7 elements do not split into 2 equal blocks"));
}

} // namespace

#endif
