// The vector kernels' two copies (cpu_vector_math.hpp): AVX2 and AVX-512
// agree within rounding on every kernel, at every length (the last partial
// vector included), and at the special values. The public ops' tests run
// whichever copy this CPU chose, and again with TROUPE_VECTOR_MATH=avx2
// (tests/tensor/CMakeLists.txt); this test compares the two directly, so it
// needs a CPU with AVX-512 and skips, saying so, without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cpu_vector_math.hpp"

namespace troupe::detail::vector_math {
namespace {

bool cpu_has_both() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

#define REQUIRE_BOTH_COPIES()                                                                                        \
  if (!cpu_has_both())                                                                                               \
  GTEST_SKIP() << "this CPU lacks AVX-512 (F, DQ, BW, VL) or AVX2: only one copy of the kernels can run here"

/// Lengths around every vector width (4, 8, 16) and the 128-element blocks.
const std::int64_t lengths[] = {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 127, 128, 129, 300};

template <class T> std::vector<T> draws(std::int64_t n, double spread, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-spread, spread);
  std::vector<T> out(static_cast<std::size_t>(n));
  for (auto& v : out)
    v = static_cast<T>(u(gen));
  return out;
}

/// |a - b| within `ulps` units of the larger magnitude (and of 1 near zero);
/// NaN only with NaN, infinities exactly.
template <class T> void expect_close(const std::vector<T>& a, const std::vector<T>& b, double ulps, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  const double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      EXPECT_TRUE(std::isnan(a[i]) && std::isnan(b[i])) << what << " [" << i << "]: " << a[i] << " vs " << b[i];
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      EXPECT_EQ(a[i], b[i]) << what << " [" << i << "]";
      continue;
    }
    const double scale = std::max({1.0, std::abs(double(a[i])), std::abs(double(b[i]))});
    EXPECT_LE(std::abs(double(a[i]) - double(b[i])), ulps * eps * scale)
      << what << " [" << i << "] of " << a.size() << ": avx2 " << a[i] << ", avx512 " << b[i];
  }
}

template <class T> void elementwise_agree() {
  using unary = void (*)(const T*, T*, std::int64_t);
  using binary = void (*)(const T*, const T*, T*, std::int64_t);
  struct one {
    const char* name;
    unary avx2_fn, avx512_fn;
  };
  std::vector<one> unaries = {{"exp", avx2::exp, avx512::exp},
                              {"tanh", avx2::tanh, avx512::tanh},
                              {"sigmoid", avx2::sigmoid, avx512::sigmoid}};
  struct two {
    const char* name;
    binary avx2_fn, avx512_fn;
  };
  std::vector<two> binaries;
  if constexpr (std::is_same_v<T, double>) {
    unaries.push_back({"gelu", avx2::gelu, avx512::gelu});
    unaries.push_back({"gelu_tanh", avx2::gelu_tanh, avx512::gelu_tanh});
    binaries.push_back({"gelu_backward", avx2::gelu_backward, avx512::gelu_backward});
    binaries.push_back({"gelu_tanh_backward", avx2::gelu_tanh_backward, avx512::gelu_tanh_backward});
  } else {
    unaries.push_back({"gelu_tanh_with_exp", avx2::gelu_tanh_with_exp, avx512::gelu_tanh_with_exp});
    binaries.push_back(
      {"gelu_tanh_backward_with_exp", avx2::gelu_tanh_backward_with_exp, avx512::gelu_tanh_backward_with_exp});
  }
  const T inf = std::numeric_limits<T>::infinity();
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (auto n : lengths) {
    auto x = draws<T>(n, 12, static_cast<unsigned>(n));
    x[0] = n % 3 == 0 ? inf : n % 3 == 1 ? -inf : nan; // special values at both ends of a vector
    x[static_cast<std::size_t>(n - 1)] = n % 2 == 0 ? T(100) : T(-100);
    const auto grad = draws<T>(n, 2, static_cast<unsigned>(n) + 1000);
    for (const auto& f : unaries) {
      std::vector<T> a(x.size()), b(x.size());
      f.avx2_fn(x.data(), a.data(), n);
      f.avx512_fn(x.data(), b.data(), n);
      expect_close(a, b, 4, f.name);
    }
    for (const auto& f : binaries) {
      std::vector<T> a(x.size()), b(x.size());
      f.avx2_fn(grad.data(), x.data(), a.data(), n);
      f.avx512_fn(grad.data(), x.data(), b.data(), n);
      expect_close(a, b, 4, f.name);
    }
  }
}

TEST(VectorIsa, ElementwiseKernelsAgreeAtEveryLengthAndSpecialValue) {
  REQUIRE_BOTH_COPIES();
  elementwise_agree<float>();
  elementwise_agree<double>();
}

/// Sums in lanes of another width round differently: a row's results agree
/// to a small multiple of its length in ulps.
template <class T> double row_ulps(std::int64_t n) { return 8.0 + 2.0 * std::sqrt(double(n)); }

template <class T> void rows_agree() {
  const std::int64_t rows = 5;
  for (auto n : lengths) {
    const auto count = static_cast<std::size_t>(rows * n);
    const auto x = draws<T>(rows * n, 6, static_cast<unsigned>(n) + 7);
    const auto grad = draws<T>(rows * n, 1, static_cast<unsigned>(n) + 8);
    const double tol = row_ulps<T>(n);
    for (bool log : {false, true}) {
      std::vector<T> a(count), b(count), da(count), db(count);
      avx2::softmax_rows(x.data(), a.data(), rows, n, log);
      avx512::softmax_rows(x.data(), b.data(), rows, n, log);
      expect_close(a, b, tol, log ? "log_softmax_rows" : "softmax_rows");
      avx2::softmax_backward_rows(grad.data(), a.data(), da.data(), rows, n, log);
      avx512::softmax_backward_rows(grad.data(), a.data(), db.data(), rows, n, log);
      expect_close(da, db, tol, "softmax_backward_rows");
    }
    {
      const std::int64_t queries = n < 8 ? n : 8;
      std::vector<T> a(count), b(count), da(count), db(count);
      avx2::causal_softmax_rows(x.data(), a.data(), rows, queries, n, T(0.25));
      avx512::causal_softmax_rows(x.data(), b.data(), rows, queries, n, T(0.25));
      expect_close(a, b, tol, "causal_softmax_rows");
      avx2::causal_softmax_backward_rows(grad.data(), a.data(), da.data(), rows, queries, n, T(0.25));
      avx512::causal_softmax_backward_rows(grad.data(), a.data(), db.data(), rows, queries, n, T(0.25));
      expect_close(da, db, tol, "causal_softmax_backward_rows");
    }
    {
      std::vector<T> a(rows), b(rows);
      avx2::log_sum_exp_rows(x.data(), a.data(), rows, n);
      avx512::log_sum_exp_rows(x.data(), b.data(), rows, n);
      expect_close(a, b, tol, "log_sum_exp_rows");
      std::vector<T> ea(static_cast<std::size_t>(n)), eb(static_cast<std::size_t>(n));
      avx2::exp_scaled(x.data(), T(1.5), T(0.5), ea.data(), n);
      avx512::exp_scaled(x.data(), T(1.5), T(0.5), eb.data(), n);
      expect_close(ea, eb, 4, "exp_scaled");
    }
    {
      // The same block sums in both copies: eight lanes whatever the width.
      const std::int64_t block = n < 128 ? n : 128;
      std::vector<T> scratch(static_cast<std::size_t>(8 * rows)), a(rows), b(rows);
      avx2::side_by_side_block(x.data(), rows, block, rows, scratch.data(), a.data());
      avx512::side_by_side_block(x.data(), rows, block, rows, scratch.data(), b.data());
      EXPECT_EQ(a, b) << "side_by_side_block of " << block;
    }
    {
      const auto weight = draws<T>(n, 2, 11);
      const auto bias = draws<T>(n, 2, 12);
      std::vector<T> ya(count), yb(count), ma(rows), mb(rows), ra(rows), rb(rows);
      layer_norm_rows<T> forward{x.data(), weight.data(), bias.data(), T(1e-5), ya.data(), ma.data(), ra.data(),
                                 rows, n};
      avx2::layer_norm(forward);
      forward.y = yb.data();
      forward.mean = mb.data();
      forward.rstd = rb.data();
      avx512::layer_norm(forward);
      expect_close(ya, yb, tol, "layer_norm y");
      expect_close(ma, mb, tol, "layer_norm mean");
      expect_close(ra, rb, tol, "layer_norm rstd");
      std::vector<T> gxa(count), gxb(count), gwa(static_cast<std::size_t>(n)), gwb(gwa.size()), gba(gwa.size()),
        gbb(gwa.size());
      layer_norm_backward_rows<T> backward{grad.data(), x.data(), ma.data(), ra.data(), weight.data(), gxa.data(),
                                           gwa.data(), gba.data(), rows, n};
      avx2::layer_norm_backward(backward);
      backward.grad_input = gxb.data();
      backward.grad_weight = gwb.data();
      backward.grad_bias = gbb.data();
      avx512::layer_norm_backward(backward);
      expect_close(gxa, gxb, 4 * tol, "layer_norm_backward dx");
      expect_close(gwa, gwb, 4 * tol, "layer_norm_backward dweight");
      expect_close(gba, gbb, 4 * tol, "layer_norm_backward dbias");
    }
  }
}

TEST(VectorIsa, RowKernelsAgreeWithinTheirSumsRounding) {
  REQUIRE_BOTH_COPIES();
  rows_agree<float>();
  rows_agree<double>();
}

TEST(VectorIsa, PhiloxWordsAndDropoutMasksAreBitwiseEqualAcrossTheCounterCarry) {
  REQUIRE_BOTH_COPIES();
  // Starts just below a wrap of the low counter word, so the carry falls
  // inside a vector; the lengths end inside the first and second of the
  // AVX-512 copy's two blocks of sixteen.
  const std::uint64_t seed = 0xfedcba9876543210ULL;
  for (const std::uint64_t start : {std::uint64_t{0}, (std::uint64_t{1} << 32) - 21, (std::uint64_t{7} << 32) - 3}) {
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{5}, std::int64_t{16}, std::int64_t{17},
                                 std::int64_t{31}, std::int64_t{32}, std::int64_t{45}, std::int64_t{300}}) {
      const auto size = static_cast<std::size_t>(n);
      std::vector<std::uint32_t> a0(size + 1, 7), a1(size + 1, 7), b0(size + 1, 7), b1(size + 1, 7);
      avx2::philox_words(seed, start, n, a0.data(), a1.data());
      avx512::philox_words(seed, start, n, b0.data(), b1.data());
      EXPECT_EQ(a0, b0) << "first words, start " << start << ", n " << n;
      EXPECT_EQ(a1, b1) << "second words, start " << start << ", n " << n;
      EXPECT_EQ(b0[size], 7u) << "a word written past n";
      std::vector<float> ma(size + 1, -1.0f), mb(size + 1, -1.0f);
      avx2::dropout_mask(seed, start, n, 0.3f, 2.0f, ma.data());
      avx512::dropout_mask(seed, start, n, 0.3f, 2.0f, mb.data());
      EXPECT_EQ(ma, mb) << "dropout mask, start " << start << ", n " << n;
      EXPECT_EQ(mb[size], -1.0f) << "a mask element written past n";
      for (std::size_t i = 0; i < size; ++i)
        ASSERT_EQ(mb[i], (b0[i] >> 8) * 0x1.0p-24f >= 0.3f ? 2.0f : 0.0f) << "mask element " << i << " of its word";
    }
  }
}

TEST(VectorIsa, TheEntryPointsRunTheCopyTheCpuChose) {
  REQUIRE_BOTH_COPIES();
  if (!available())
    GTEST_SKIP() << "TROUPE_VECTOR_MATH=off: no copy is chosen, the ops run their scalar loops";
  // Where both copies run, avx512_chosen() follows TROUPE_VECTOR_MATH; the
  // entry point gives the chosen copy's bits, on rows whose sums the two
  // copies round differently.
  const std::int64_t rows = 16, n = 1000;
  const auto x = draws<float>(rows * n, 6, 3);
  std::vector<float> via_entry(static_cast<std::size_t>(rows * n)), via_avx2(via_entry.size()),
    via_avx512(via_entry.size());
  softmax_rows(x.data(), via_entry.data(), rows, n, false);
  avx2::softmax_rows(x.data(), via_avx2.data(), rows, n, false);
  avx512::softmax_rows(x.data(), via_avx512.data(), rows, n, false);
  ASSERT_NE(via_avx2, via_avx512) << "these rows no longer tell the two copies apart";
  const char* setting = std::getenv("TROUPE_VECTOR_MATH");
  const bool forced_avx2 = setting != nullptr && std::string_view(setting) == "avx2";
  EXPECT_EQ(avx512_chosen(), !forced_avx2);
  EXPECT_EQ(via_entry, forced_avx2 ? via_avx2 : via_avx512);
}

} // namespace
} // namespace troupe::detail::vector_math
