// Where float32 GEMM goes to oneDNN (cpu_onednn_matmul.hpp): inside the
// window of sizes where it was measured faster, on a CPU with its AVX-512
// kernels, and not under TROUPE_GEMM=openblas; outside it the call does
// nothing and says so, and OpenBLAS runs. The products themselves are
// checked through the public ops in linalg_test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <vector>

#include "cpu_onednn.hpp"
#include "cpu_onednn_matmul.hpp"
#include "troupe/tensor/cpu_blas.hpp"

namespace troupe::detail {
namespace {

bool openblas_chosen() {
  const char* choice = std::getenv("TROUPE_GEMM");
  return choice != nullptr && std::string_view(choice) == "openblas";
}

/// Runs [m, k] x [k, n] with every entry 1 (so each of C's entries is k)
/// and says whether oneDNN took it; C is left as it was when it did not.
bool runs_on_onednn(std::int64_t m, std::int64_t n, std::int64_t k) {
  std::vector<float> a(static_cast<std::size_t>(m * k), 1.0f), b(static_cast<std::size_t>(k * n), 1.0f);
  std::vector<float> c(static_cast<std::size_t>(m * n), -1.0f);
  const bool took = onednn_sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  for (auto v : c)
    if (v != (took ? static_cast<float>(k) : -1.0f)) {
      ADD_FAILURE() << "C holds " << v << (took ? ", not k" : " after a call that did nothing");
      break;
    }
  return took;
}

TEST(OnednnMatmul, TakesTheWindowOfMeasuredSizesOnAnAvx512Cpu) {
  if (openblas_chosen()) {
    EXPECT_FALSE(runs_on_onednn(256, 256, 64)) << "TROUPE_GEMM=openblas must keep every product on OpenBLAS";
    EXPECT_EQ(float32_gemm(), "OpenBLAS");
    return;
  }
  if (!onednn_runs_avx512()) {
    EXPECT_FALSE(runs_on_onednn(256, 256, 64)) << "without oneDNN's AVX-512 kernels OpenBLAS runs";
    EXPECT_EQ(float32_gemm(), "OpenBLAS");
    GTEST_SKIP() << "this CPU has no AVX-512 for oneDNN: only the fallback was checked";
  }
  EXPECT_EQ(float32_gemm().substr(0, 6), "oneDNN") << float32_gemm(); // what benchmarks print
  EXPECT_TRUE(runs_on_onednn(256, 256, 64));     // 2^22 multiply-adds: a linear layer's
  EXPECT_TRUE(runs_on_onednn(128, 64, 64));      // 2^19, the window's lower end
  EXPECT_FALSE(runs_on_onednn(64, 64, 64));      // 2^18: OpenBLAS's small path
  EXPECT_FALSE(runs_on_onednn(32, 4, 3));
  // Above 2^30 it returns before touching the (here absent) operands.
  EXPECT_FALSE(onednn_sgemm(false, false, 2048, 2048, 1024, 1.0f, nullptr, 1024, nullptr, 2048, 0.0f, nullptr, 2048));
}

TEST(OnednnMatmul, TransposedOperandsAlphaAndBetaMatchALoop) {
  if (openblas_chosen() || !onednn_runs_avx512())
    GTEST_SKIP() << "oneDNN's matmul does not run here (TROUPE_GEMM=openblas, or no AVX-512)";
  const std::int64_t m = 100, n = 72, k = 80, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "A transposed " << ta << ", B transposed " << tb);
      const auto lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      std::vector<float> a(static_cast<std::size_t>((ta ? k : m) * lda)), b(static_cast<std::size_t>((tb ? n : k) * ldb));
      for (std::size_t i = 0; i < a.size(); ++i)
        a[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = static_cast<float>(std::cos(0.23 * static_cast<double>(i)));
      std::vector<float> c(static_cast<std::size_t>(m * ldc), 2.0f);
      ASSERT_TRUE(onednn_sgemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, c.data(), ldc));
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < ldc; ++j) {
          const auto got = c[static_cast<std::size_t>(i * ldc + j)];
          if (j >= n) {
            ASSERT_EQ(got, 2.0f) << "wrote padding at " << i << ", " << j;
            continue;
          }
          double s = 0;
          for (std::int64_t p = 0; p < k; ++p)
            s += static_cast<double>(ta ? a[p * lda + i] : a[i * lda + p]) *
                 static_cast<double>(tb ? b[j * ldb + p] : b[p * ldb + j]);
          ASSERT_NEAR(got, 0.5 * s + 0.25 * 2.0, 1e-4) << i << ", " << j;
        }
    }
}

/// Actors on different threads run the same shapes at once: one cached
/// primitive, each thread with its own scratchpad and data. Each thread's
/// results must be bitwise what one thread alone computes from its data.
TEST(OnednnMatmul, OnePrimitiveRunsOnSeveralThreadsAtOnce) {
  if (openblas_chosen() || !onednn_runs_avx512())
    GTEST_SKIP() << "oneDNN's matmul does not run here (TROUPE_GEMM=openblas, or no AVX-512)";
  constexpr std::int64_t m = 256, n = 192, k = 128;
  constexpr int threads = 4, calls = 25;
  auto inputs = [](int t) {
    std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
    for (std::size_t i = 0; i < a.size(); ++i)
      a[i] = static_cast<float>(std::sin(0.11 * static_cast<double>(i) + t));
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<float>(std::cos(0.07 * static_cast<double>(i) - t));
    return std::pair{a, b};
  };
  auto product = [](const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<float> c(static_cast<std::size_t>(m * n));
    EXPECT_TRUE(onednn_sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n));
    return c;
  };
  std::vector<std::vector<float>> alone;
  for (int t = 0; t < threads; ++t) {
    const auto [a, b] = inputs(t);
    alone.push_back(product(a, b));
  }
  std::vector<int> mismatches(threads, 0);
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t)
    running.emplace_back([&, t] {
      const auto [a, b] = inputs(t);
      for (int call = 0; call < calls; ++call)
        if (product(a, b) != alone[static_cast<std::size_t>(t)])
          ++mismatches[static_cast<std::size_t>(t)];
    });
  for (auto& thread : running)
    thread.join();
  for (int t = 0; t < threads; ++t)
    EXPECT_EQ(mismatches[static_cast<std::size_t>(t)], 0) << "thread " << t << " of " << threads;
}

} // namespace
} // namespace troupe::detail
