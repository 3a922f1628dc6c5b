// Indexing ops against loops written out here, and their index validation.
#include "test_util.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::make;
using test::sample;
using test::values;
using testing::HasSubstr;

tensor longs(std::vector<std::int64_t> v, const dims& shape) {
  return tensor::from(v, shape);
}

TEST(Index, IndexSelectPicksSlicesAlongAnyDim) {
  auto a = make({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  expect_close(index_select(a, 0, longs({2, 0, 2}, {3})),
               std::vector<double>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11}, 0);
  expect_close(index_select(a, 1, longs({3, 1}, {2})), std::vector<double>{3, 1, 7, 5, 11, 9}, 0);
  // Works on a transposed view too.
  expect_close(index_select(a.t(), 0, longs({1}, {1})), std::vector<double>{1, 5, 9}, 0);
  auto message = test::usage_error_of([&] { (void)index_select(a, 0, longs({0, 3}, {2})); });
  EXPECT_THAT(message, HasSubstr("index_select: index 3"));
  EXPECT_THAT(message, HasSubstr("[3, 4]"));
  EXPECT_THAT(test::usage_error_of([&] { (void)index_select(a, 0, longs({-1}, {1})); }),
              HasSubstr("index -1"));
  EXPECT_THAT(test::usage_error_of([&] { (void)index_select(a, 0, make({0}, {1})); }),
              HasSubstr("index must be int64"));
}

TEST(Index, GatherFollowsTorchSemantics) {
  auto a = make({1, 2, 3, 4, 5, 6}, {2, 3});
  // out[i][j] = a[i][index[i][j]]
  expect_close(gather(a, 1, longs({2, 0, 1, 1}, {2, 2})), std::vector<double>{3, 1, 5, 5}, 0);
  // out[i][j] = a[index[i][j]][j]
  expect_close(gather(a, 0, longs({1, 0, 1}, {1, 3})), std::vector<double>{4, 2, 6}, 0);
  EXPECT_THAT(test::usage_error_of([&] { (void)gather(a, 1, longs({3}, {1, 1})); }),
              HasSubstr("gather: index 3"));
}

TEST(Index, ScatterAddAccumulatesRepeatedIndices) {
  auto a = tensor::zeros({2, 3}, dtype::float64);
  auto src = make({1, 2, 3, 4, 5, 6}, {2, 3});
  auto index = longs({0, 0, 2, 1, 1, 1}, {2, 3});
  auto out = scatter_add(a, 1, index, src);
  expect_close(out, std::vector<double>{3, 0, 3, 0, 15, 0}, 0);
  expect_close(a, std::vector<double>(6, 0.0), 0); // input untouched
  EXPECT_THAT(test::usage_error_of([&] { (void)scatter_add(a, 1, longs({0, 5}, {1, 2}), src); }),
              HasSubstr("scatter_add: index 5"));
  // gather's adjoint: <gather(x), g> == <x, scatter_add(0, g)>.
  auto x = sample({3, 4}, 1);
  auto g = sample({3, 2}, 2);
  auto idx = longs({0, 3, 3, 1, 2, 2}, {3, 2});
  EXPECT_NEAR(test::weighted_sum(gather(x, 1, idx), g),
              test::weighted_sum(x, scatter_add(tensor::zeros({3, 4}, dtype::float64), 1, idx, g)),
              1e-14);
}

TEST(Index, IndexAddAccumulatesInPlace) {
  auto a = tensor::zeros({3, 2}, dtype::float64);
  auto src = make({1, 2, 3, 4, 5, 6}, {3, 2});
  index_add_(a, 0, longs({2, 0, 2}, {3}), src);
  expect_close(a, std::vector<double>{3, 4, 0, 0, 6, 8}, 0);
  EXPECT_THAT(test::usage_error_of([&] { index_add_(a, 0, longs({0, 1, 7}, {3}), src); }),
              HasSubstr("index_add_: index 7"));
  EXPECT_THAT(test::usage_error_of([&] { index_add_(a, 0, longs({0}, {1}), src); }),
              HasSubstr("index_add_: source shape [3, 2]"));
}

} // namespace
} // namespace troupe
