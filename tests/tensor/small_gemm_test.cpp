// The small products of attention's heads (cpu_small_gemm.hpp): LIBXSMM's
// generated float32 kernels and the OpenBLAS path (float64) equal a plain
// triple loop, for every shape attention makes at lengths up to 130 and head
// sizes up to 64, with leading dimensions wider than the matrices, and
// write nothing outside C's rows and columns. The attention tests run them
// again inside the op; on a CPU with AVX2 the float32 shapes must be
// generated kernels, not OpenBLAS's fallback.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cpu_small_gemm.hpp"

namespace troupe::detail {
namespace {

struct shape {
  std::int64_t m, n, k;
  bool a_transposed;
};

template <class T> std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v)
    x = static_cast<T>(uniform(engine));
  return v;
}

/// Runs one shape with leading dimensions `pad` wider than needed and checks
/// C against the triple loop, and that the padding of C is untouched.
template <class T> void expect_product(const shape& s, std::int64_t pad, double tolerance) {
  const auto a_rows = s.a_transposed ? s.k : s.m, a_cols = s.a_transposed ? s.m : s.k;
  const auto lda = a_cols + pad, ldb = s.n + pad, ldc = s.n + pad;
  const auto a = random_values<T>(static_cast<std::size_t>(a_rows * lda), 1);
  const auto b = random_values<T>(static_cast<std::size_t>(s.k * ldb), 2);
  constexpr T sentinel = T(12345);
  std::vector<T> c(static_cast<std::size_t>(s.m * ldc), sentinel);
  const small_gemm<T> product(s.m, s.n, s.k, lda, s.a_transposed, ldb, ldc);
  product(a.data(), b.data(), c.data());
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const auto got = c[static_cast<std::size_t>(i * ldc + j)];
      if (j >= s.n) {
        ASSERT_EQ(got, sentinel) << "wrote padding at " << i << ", " << j;
        continue;
      }
      double want = 0;
      for (std::int64_t p = 0; p < s.k; ++p) {
        const auto a_ip = s.a_transposed ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)];
        want += static_cast<double>(a_ip) * static_cast<double>(b[static_cast<std::size_t>(p * ldb + j)]);
      }
      ASSERT_NEAR(got, want, tolerance) << "C[" << i << ", " << j << "]";
    }
}

/// attention's products at one length and head size (cpu_attention.cpp):
/// blocks of 32 query rows, keys up to the block's end, and the key blocks'
/// transposed products over the queries after them.
std::vector<shape> attention_shapes(std::int64_t seq, std::int64_t hs) {
  std::vector<shape> shapes;
  for (std::int64_t i0 = 0; i0 < seq; i0 += 32) {
    const auto i1 = std::min(seq, i0 + 32), rows = i1 - i0;
    shapes.push_back({rows, i1, hs, false});       // scores, weights' gradient
    shapes.push_back({rows, hs, i1, false});       // values, queries' gradient
    shapes.push_back({rows, hs, seq - i0, true});  // keys' and values' gradients
  }
  return shapes;
}

TEST(SmallGemm, EqualsTheTripleLoopAtAttentionsShapes) {
  for (std::int64_t seq : {1, 7, 31, 32, 33, 64, 100, 128, 130})
    for (std::int64_t hs : {1, 3, 8, 16, 32, 64})
      for (const auto& s : attention_shapes(seq, hs)) {
        SCOPED_TRACE(testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k << " transposed A "
                                        << s.a_transposed);
        expect_product<float>(s, 5, 1e-4 * static_cast<double>(s.k));
        expect_product<double>(s, 3, 1e-12 * static_cast<double>(s.k));
      }
}

TEST(SmallGemm, Float32ShapesRunGeneratedKernelsOnAnAvx2Cpu) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "this CPU has no AVX2 with FMA: LIBXSMM may leave shapes to OpenBLAS here";
  for (const auto& s : attention_shapes(128, 32)) {
    const small_gemm<float> product(s.m, s.n, s.k, 3 * 256, s.a_transposed, 3 * 256, 256);
    EXPECT_TRUE(product.generated()) << "m " << s.m << " n " << s.n << " k " << s.k;
  }
  // float64 always goes to OpenBLAS.
  EXPECT_FALSE(small_gemm<double>(32, 32, 32, 32, false, 32, 32).generated());
}

TEST(SmallGemm, TransposesAHeadsColumns) {
  const std::int64_t rows = 37, cols = 5, ld = 16;
  const auto in = random_values<float>(static_cast<std::size_t>(rows * ld), 3);
  std::vector<float> out(static_cast<std::size_t>(cols * rows), -1.0f);
  transpose_small(in.data(), ld, rows, cols, out.data());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(out[static_cast<std::size_t>(c * rows + r)], in[static_cast<std::size_t>(r * ld + c)]) << r << " " << c;
}

} // namespace
} // namespace troupe::detail
