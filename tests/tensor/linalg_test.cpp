// GEMM against a naive triple loop, for every layout BLAS is handed:
// contiguous, transposed views (passed as Trans), slices with a leading
// dimension, and layouts that must be copied.
#include "test_util.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::sample;
using test::values;
using testing::HasSubstr;

std::vector<double> naive_matmul(const tensor& a, const tensor& b) {
  const auto m = a.size(0);
  const auto k = a.size(1);
  const auto n = b.size(1);
  std::vector<double> out(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p)
        s += a.at({i, p}) * b.at({p, j});
      out[i * n + j] = s;
    }
  return out;
}

TEST(Linalg, MatmulMatchesTheNaiveProduct) {
  for (auto type : {dtype::float64, dtype::float32}) {
    const double tol = type == dtype::float32 ? 1e-5 : 1e-13;
    auto a = sample({5, 7}, 1, type);
    auto b = sample({7, 3}, 2, type);
    auto c = matmul(a, b);
    EXPECT_EQ(c.shape(), (dims{5, 3}));
    EXPECT_EQ(c.type(), type);
    expect_close(c, naive_matmul(a, b), tol);
  }
}

TEST(Linalg, TransposedAndSlicedOperandsGiveTheSameProduct) {
  auto at = sample({7, 5}, 3).t();               // [5, 7] column-major
  auto bt = sample({3, 7}, 4).t();               // [7, 3] column-major
  auto wide = sample({6, 10}, 5);
  auto sliced = wide.narrow(0, 1, 5).narrow(1, 2, 7); // [5, 7], ld 10
  auto b = sample({7, 3}, 6);
  expect_close(matmul(at, b), naive_matmul(at, b), 1e-13);
  expect_close(matmul(at, bt), naive_matmul(at, bt), 1e-13);
  expect_close(matmul(sliced, bt), naive_matmul(sliced, bt), 1e-13);
  expect_close(matmul(sliced.t().t(), b), naive_matmul(sliced, b), 1e-13);
  // Neither layout fits BLAS (every other column, broadcast): copied.
  auto stepped = wide.slice(1, 0, 10, 2).narrow(0, 0, 5); // [5, 5], strides [10, 2]
  auto square = sample({5, 2}, 7);
  expect_close(matmul(stepped, square), naive_matmul(stepped, square), 1e-13);
  auto broadcast = sample({1, 7}, 8).expand({4, 7});
  expect_close(matmul(broadcast, b), naive_matmul(broadcast, b), 1e-13);
}

TEST(Linalg, VectorShapedOperandsAndEmptyInnerDimension) {
  auto row = sample({1, 4}, 9);
  auto col = sample({4, 1}, 10);
  expect_close(matmul(row, col), naive_matmul(row, col), 1e-14);
  expect_close(matmul(col, row), naive_matmul(col, row), 1e-14);
  expect_close(matmul(col.t(), row.t()), naive_matmul(col.t(), row.t()), 1e-14);
  auto empty = matmul(tensor::zeros({3, 0}, dtype::float64), tensor::zeros({0, 2}, dtype::float64));
  expect_close(empty, std::vector<double>(6, 0.0), 0);
}

TEST(Linalg, MismatchedShapesNameTheOpAndBothShapes) {
  auto message = test::usage_error_of(
      [] { (void)matmul(tensor::zeros({4, 3}), tensor::zeros({5, 2})); });
  EXPECT_EQ(message, "matmul: inner dimensions differ: [4, 3] x [5, 2]");
  EXPECT_THAT(test::usage_error_of([] { (void)matmul(tensor::zeros({4}), tensor::zeros({4, 2})); }),
              HasSubstr("matmul: expected 2-D operands"));
  EXPECT_THAT(test::usage_error_of([] {
                (void)matmul(tensor::zeros({2, 2}), tensor::zeros({2, 2}, dtype::float64));
              }),
              HasSubstr("matmul: dtypes differ: float32 and float64"));
  EXPECT_THAT(test::usage_error_of([] {
                (void)matmul(tensor::zeros({2, 2}, dtype::int64), tensor::zeros({2, 2}, dtype::int64));
              }),
              HasSubstr("matmul: expected float32 or float64, got int64"));
}

TEST(Linalg, BmmMultipliesEachBatchIncludingTransposedBatches) {
  auto a = sample({3, 4, 5}, 11);
  auto b = sample({3, 2, 5}, 12).transpose(1, 2); // [3, 5, 2], column-major batches
  auto c = bmm(a, b);
  EXPECT_EQ(c.shape(), (dims{3, 4, 2}));
  for (std::int64_t i = 0; i < 3; ++i)
    expect_close(c.select(0, i), naive_matmul(a.select(0, i), b.select(0, i)), 1e-13);
  EXPECT_THAT(test::usage_error_of([&] { (void)bmm(a, sample({2, 5, 2})); }),
              HasSubstr("bmm: batch sizes differ"));
}

TEST(Linalg, AddmmAccumulatesWithAlphaAndBeta) {
  auto a = sample({4, 3}, 13);
  auto b = sample({3, 5}, 14);
  auto out = sample({4, 5}, 15);
  auto before = values(out);
  auto product = naive_matmul(a, b);
  addmm_(out, a, b, 0.5, 2.0);
  std::vector<double> expected;
  for (std::size_t i = 0; i < before.size(); ++i)
    expected.push_back(2.0 * before[i] + 0.5 * product[i]);
  expect_close(out, expected, 1e-13);

  // A transposed output view is written through (via a temporary).
  auto storage_owner = sample({5, 4}, 16);
  auto out_t = storage_owner.t();
  auto before_t = values(out_t);
  addmm_(out_t, a, b, 1.0, 1.0);
  for (std::size_t i = 0; i < before_t.size(); ++i)
    expected[i] = before_t[i] + product[i];
  expect_close(storage_owner.t(), expected, 1e-13);

  // beta = 0 ignores the old contents, NaNs included.
  auto garbage = tensor::full({4, 5}, NAN, dtype::float64);
  addmm_(garbage, a, b, 1.0, 0.0);
  expect_close(garbage, product, 1e-13);
  EXPECT_THAT(test::usage_error_of([&] { addmm_(garbage, b, a); }), HasSubstr("addmm_"));
}

/// float32 products of a linear layer's sizes (oneDNN's matmul runs them on
/// a CPU with AVX-512, OpenBLAS elsewhere and under TROUPE_GEMM=openblas):
/// every layout of the operands, alpha, beta and a strided output, against
/// the float64 product.
TEST(Linalg, Float32ProductsOfALinearLayersSizeMatchFloat64) {
  const std::int64_t m = 192, k = 96, n = 80; // 1.5M multiply-adds
  auto a64 = sample({m, k}, 21);
  auto b64 = sample({k, n}, 22);
  const auto product = naive_matmul(a64, b64);
  auto a = a64.to(dtype::float32);
  auto b = b64.to(dtype::float32);
  auto a_t = a.t().contiguous().t(); // column-major: handed over transposed
  auto b_t = b.t().contiguous().t();
  for (const auto& [x, y] : {std::pair{a, b}, std::pair{a_t, b}, std::pair{a, b_t}, std::pair{a_t, b_t}}) {
    expect_close(matmul(x, y), product, 1e-4);
    auto out = sample({m, n}, 23).to(dtype::float32);
    const auto before = values(out);
    addmm_(out, x, y, 0.5, 2.0);
    std::vector<double> expected;
    for (std::size_t i = 0; i < before.size(); ++i)
      expected.push_back(2.0 * before[i] + 0.5 * product[i]);
    expect_close(out, expected, 1e-4);
    auto garbage = tensor::full({m, n}, NAN, dtype::float32);
    addmm_(garbage, x, y, 1.0, 0.0);
    expect_close(garbage, product, 1e-4);
  }
  // A slice of a wider output: a leading dimension larger than n.
  auto wide = tensor::zeros({m, n + 16}, dtype::float32);
  auto slice = wide.narrow(1, 8, n);
  addmm_(slice, a, b, 1.0, 0.0);
  expect_close(slice, product, 1e-4);
  for (auto v : values(wide.narrow(1, 0, 8)))
    ASSERT_EQ(v, 0.0);
  for (auto v : values(wide.narrow(1, n + 8, 8)))
    ASSERT_EQ(v, 0.0);
}

} // namespace
} // namespace troupe
