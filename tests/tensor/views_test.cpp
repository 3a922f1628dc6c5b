// Views alias their base; copies do not. Joining, splitting, arange and the
// comparison helpers.
#include "test_util.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::make;
using test::sample;
using test::values;
using testing::HasSubstr;

TEST(Views, WritingThroughAViewShowsInTheBase) {
  auto base = make({0, 1, 2, 3, 4, 5}, {2, 3});
  auto t = base.t();
  auto row = base.select(0, 1);
  auto flat = base.view({6});
  EXPECT_TRUE(t.shares_storage_with(base));
  EXPECT_EQ(base.raw_data(), flat.raw_data());
  EXPECT_EQ(row.raw_data(), static_cast<double*>(base.raw_data()) + 3);
  row.fill(9);
  EXPECT_EQ(base.at({1, 0}), 9.0);
  EXPECT_EQ(t.at({2, 1}), 9.0);
  mul_(t, 2.0);
  EXPECT_EQ(flat.at({4}), 18.0);
  EXPECT_EQ(flat.at({1}), 2.0);
}

TEST(Views, ContiguousCopiesOnlyWhenNeededAndCloneAlwaysCopies) {
  auto base = sample({3, 4}, 1);
  EXPECT_EQ(base.contiguous().raw_data(), base.raw_data());
  auto copy = base.clone();
  EXPECT_NE(copy.raw_data(), base.raw_data());
  EXPECT_FALSE(copy.shares_storage_with(base));
  EXPECT_EQ(values(copy), values(base));
  auto t = base.t();
  EXPECT_FALSE(t.is_contiguous());
  auto tc = t.contiguous();
  EXPECT_TRUE(tc.is_contiguous());
  EXPECT_FALSE(tc.shares_storage_with(base));
  EXPECT_EQ(values(tc), values(t));
  copy.fill(0);
  EXPECT_NE(values(copy), values(base));
}

TEST(Views, SplitAndChunkReturnViewsLikeTorch) {
  auto a = make({0, 1, 2, 3, 4, 5, 6}, {7});
  auto pieces = split(a, 3, 0);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].shape(), (dims{1}));
  EXPECT_TRUE(pieces[1].shares_storage_with(a));
  expect_close(pieces[1], std::vector<double>{3, 4, 5}, 0);
  auto chunks = chunk(a, 3, 0); // ceil(7 / 3) = 3 per chunk
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].shape(), (dims{3}));
  EXPECT_EQ(chunks[2].shape(), (dims{1}));
  EXPECT_EQ(chunk(make({0, 1, 2, 3, 4, 5}, {6}), 4, 0).size(), 3u); // torch gives 3 of 2
  auto m = sample({4, 6}, 2);
  auto columns = chunk(m, 2, 1);
  EXPECT_EQ(columns[1].shape(), (dims{4, 3}));
  EXPECT_EQ(columns[1].at({2, 0}), m.at({2, 3}));
}

TEST(Views, CatAndStackJoinAlongAnyDim) {
  auto a = make({1, 2, 3, 4}, {2, 2});
  auto b = make({5, 6}, {2, 1});
  expect_close(cat({a, b}, 1), std::vector<double>{1, 2, 5, 3, 4, 6}, 0);
  expect_close(cat({a, a.t()}, 0), std::vector<double>{1, 2, 3, 4, 1, 3, 2, 4}, 0);
  auto s = stack({a, a}, 1);
  EXPECT_EQ(s.shape(), (dims{2, 2, 2}));
  expect_close(s, std::vector<double>{1, 2, 1, 2, 3, 4, 3, 4}, 0);
  EXPECT_EQ(stack({a, a}, -1).shape(), (dims{2, 2, 2}));
  auto message = test::usage_error_of([&] { (void)cat({a, b}, 0); });
  EXPECT_THAT(message, HasSubstr("cat"));
  EXPECT_THAT(message, HasSubstr("[2, 1]"));
  EXPECT_THAT(test::usage_error_of([&] { (void)stack({a, b}, 0); }), HasSubstr("stack"));
  // Round trip: cat of split is the original.
  auto m = sample({5, 3}, 3);
  EXPECT_EQ(values(cat(split(m, 2, 0), 0)), values(m));
}

TEST(Creation, ArangeIsInt64WhenIntegral) {
  auto a = arange(0, 5);
  EXPECT_EQ(a.type(), dtype::int64);
  EXPECT_EQ(a.to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(10, 0, -3).to_vector<std::int64_t>(), (std::vector<std::int64_t>{10, 7, 4, 1}));
  auto f = arange(0, 1, 0.25);
  EXPECT_EQ(f.type(), dtype::float32);
  expect_close(f, std::vector<double>{0, 0.25, 0.5, 0.75}, 0);
  EXPECT_EQ(arange(0, 3, 1, dtype::float64).type(), dtype::float64);
  EXPECT_EQ(arange(5, 0).numel(), 0);
  EXPECT_THAT(test::usage_error_of([] { (void)arange(0, 1, 0); }), HasSubstr("arange"));
}

TEST(Comparison, AllcloseAndMaxAbsDiff) {
  auto a = make({1, 2, 3}, {3});
  auto b = make({1, 2, 3.001}, {3});
  EXPECT_TRUE(allclose(a, a));
  EXPECT_FALSE(allclose(a, b));
  EXPECT_TRUE(allclose(a, b, 1e-3));
  EXPECT_FALSE(allclose(a, make({1, 2, 3}, {1, 3})));
  EXPECT_FALSE(allclose(make({NAN}, {1}), make({NAN}, {1})));
  EXPECT_NEAR(max_abs_diff(a, b), 0.001, 1e-12);
  EXPECT_TRUE(allclose(a.to(dtype::float32), a));
  EXPECT_THAT(test::usage_error_of([&] { (void)max_abs_diff(a, make({1}, {1})); }),
              HasSubstr("max_abs_diff: shapes differ: [3] and [1]"));
}

} // namespace
} // namespace troupe
