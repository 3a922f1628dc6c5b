// Stream ordering that only the stand-in runtime (tests/support/cuda_on_host/)
// can show, because its streams run queued work only when something waits
// for it:
// - copies from the host run on a stream of their own (cuda_context.hpp):
//   a copy to the device must be ready while the kernels the thread queued
//   before it have still not run. On a GPU that is the copy overlapping
//   those kernels, which cannot be seen there without timing;
// - a copy to the host started with start_copy_to_host runs only when
//   waited for, and its pinned block is reused only after it ran;
// - two threads reading one tensor at once: the memory is freed only after
//   both reads, which on a GPU fails once in many runs, if ever;
// - ordering one thread's stream after another's reuses the thread's event.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda_device_under_test.hpp"
#include "test_util.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe {
namespace {

using test::expect_close;

const device gpu = test::cuda_device_under_test();

/// A host tensor of `count` float32 values that differ from element to
/// element and from `seed` to `seed`.
tensor numbered(std::int64_t count, int seed) {
  auto t = tensor::empty({count}, dtype::float32);
  auto* data = static_cast<float*>(t.raw_data());
  for (std::int64_t i = 0; i < count; ++i)
    data[i] = static_cast<float>((i * 7 + seed) % 1009);
  return t;
}

/// Runs what earlier tests left queued on any stream (frees on pooled
/// streams of ended threads), so that waiting_work() counts this test's.
void run_everything_queued() {
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  ASSERT_EQ(cuda_on_host::waiting_work(), 0u);
}

bool same_bytes(const tensor& a, const tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A copy of 16 KiB (one pinned slot) and one of 40 MiB (through every slot,
// twice and more).
class CopiesToTheDevice : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(CopiesToTheDevice, AreReadyWithoutRunningTheKernelsQueuedBeforeThem) {
  const auto count = GetParam();
  auto a = numbered(64 * 64, 1).reshape({64, 64}).to(gpu);
  auto b = numbered(64 * 64, 2).reshape({64, 64}).to(gpu);
  ASSERT_NO_FATAL_FAILURE(run_everything_queued());

  auto product = matmul(a, b); // queued on this thread's stream of kernels
  const auto kernels_waiting = cuda_on_host::waiting_work();
  ASSERT_GT(kernels_waiting, 0u);

  auto host = numbered(count, 3);
  const auto expected = host.clone();
  auto copied = host.to(gpu);
  host.fill(-1.0); // the caller may reuse its memory at once
  cuda_synchronize(copied);
  EXPECT_EQ(cuda_on_host::waiting_work(), kernels_waiting) << "the copy ran the kernels queued before it";
  EXPECT_TRUE(same_bytes(copied.to(device::cpu()), expected));
  EXPECT_EQ(cuda_on_host::waiting_work(), kernels_waiting) << "the copy back ran unrelated kernels";

  // The first kernel that reads the copy waits for it, and the product is
  // what it would have been.
  EXPECT_TRUE(same_bytes(mul(copied, 2.0).to(device::cpu()), mul(expected, 2.0)));
  expect_close(product.to(device::cpu()), matmul(a.to(device::cpu()), b.to(device::cpu())), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(OfEverySize, CopiesToTheDevice,
                         ::testing::Values(std::int64_t{4096}, std::int64_t{10} << 20));

TEST(CopiesFromTheDevice, WaitForTheKernelsThatWroteTheTensor) {
  auto a = numbered(128 * 128, 4).reshape({128, 128}).to(gpu);
  ASSERT_NO_FATAL_FAILURE(run_everything_queued());
  auto doubled = mul(a, 2.0);
  ASSERT_GT(cuda_on_host::waiting_work(), 0u);
  expect_close(doubled.to(device::cpu()), mul(a.to(device::cpu()), 2.0), 0.0);
}

/// Whether the stand-in refuses pinned memory in this run (the copies to
/// the host then run at once).
bool without_pinned_memory() {
  const char* pinned = std::getenv("TROUPE_CUDA_ON_HOST_PINNED");
  return pinned != nullptr && std::string(pinned) == "0";
}

TEST(StartedCopiesToTheHost, DoNotRunTheKernelsThatWriteTheTensorUntilWaitedFor) {
  const auto host = numbered(4096, 6);
  auto a = host.to(gpu);
  ASSERT_NO_FATAL_FAILURE(run_everything_queued());
  auto doubled = mul(a, 2.0);
  auto pending = start_copy_to_host(doubled);
  EXPECT_EQ(pending.host.where(), device::cpu());
  if (without_pinned_memory())
    EXPECT_EQ(cuda_on_host::waiting_work(), 0u) << "without pinned memory the copy runs at once";
  else
    EXPECT_GT(cuda_on_host::waiting_work(), 0u) << "starting the copy waited for the kernels";
  pending.wait();
  EXPECT_TRUE(same_bytes(pending.host, mul(host, 2.0)));

  // A host tensor is its own copy.
  auto on_cpu = numbered(16, 7);
  auto same = start_copy_to_host(on_cpu);
  same.wait();
  EXPECT_TRUE(same.host.shares_storage_with(on_cpu));
}

TEST(StartedCopiesToTheHost, DroppedUnwaitedKeepTheirBlockUntilTheCopyRan) {
  // A copy started on another thread and dropped before it ran: its pinned
  // block must not serve the next copy while the first may still write it.
  const auto first = numbered(4096, 8);
  const auto second = numbered(4096, 9);
  auto on_device = first.to(gpu);
  cuda_synchronize(gpu);
  std::thread dropper([&] {
    auto doubled = mul(on_device, 1.0); // queued on this thread's stream
    auto abandoned = start_copy_to_host(doubled);
  });
  dropper.join();
  auto pending = start_copy_to_host(second.to(gpu));
  pending.wait();
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess); // what of the dropped copy had not run, runs now
  EXPECT_TRUE(same_bytes(pending.host, second)) << "the dropped copy wrote into a block taken again";
}

TEST(TwoThreadsReadingOneTensor, FreeItOnlyAfterBothReads) {
  const auto host = numbered(4096, 5);
  auto shared = host.to(gpu);
  cuda_synchronize(gpu);
  tensor by_a, by_b;
  std::thread a([&] {
    // Between a's ordering of its read and its launch, b reads the same
    // tensor and becomes its last user, the stream it is freed on.
    cuda_on_host::before_next_launch([&] {
      std::thread b([&] { by_b = mul(shared, 3.0); });
      b.join();
    });
    by_a = mul(shared, 2.0);
  });
  a.join();
  shared = tensor(); // the last reference: the free is queued on b's stream
  // Runs b's stream, the free included; a's read must run before it.
  EXPECT_TRUE(same_bytes(by_b.to(device::cpu()), mul(host, 3.0)));
  EXPECT_TRUE(same_bytes(by_a.to(device::cpu()), mul(host, 2.0))) << "a read the tensor after b's stream freed it";
}

TEST(TensorsPassedBetweenThreads, AreOrderedWithoutMakingAnEventEachTime) {
  // Each op here reads a tensor another thread wrote last: its stream is
  // ordered after that thread's by an event the reading thread records
  // anew each time (cuda_context.hpp, execution_stream::ordering).
  const auto host = numbered(1024, 6);
  auto t = host.to(gpu);
  auto on_another_thread = [&] { std::thread([&] { t = mul(t, 1.0); }).join(); };
  on_another_thread(); // the pooled streams and events of both threads exist from here on
  t = add(t, 1.0);
  const auto made = cuda_on_host::events_made();
  for (int i = 0; i < 10; ++i) {
    on_another_thread();
    t = add(t, 1.0);
  }
  EXPECT_EQ(cuda_on_host::events_made(), made) << "events made for 20 orderings between two threads";
  EXPECT_TRUE(same_bytes(t.to(device::cpu()), add(host, 11.0)));
}

} // namespace
} // namespace troupe
