// Manual partitions, the balance-by-time dynamic programme and profiling.
#include "troupe/parallel/partition.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "troupe/autograd/nn/all.hpp"

namespace troupe::parallel {
namespace {

using ::testing::HasSubstr;

std::vector<layer_profile> synthetic(const std::vector<double>& ms,
                                     std::size_t parameter_bytes = 100,
                                     std::size_t activation_bytes = 10) {
  std::vector<layer_profile> out;
  for (double t : ms)
    out.push_back({t / 2, t / 2, parameter_bytes, activation_bytes});
  return out;
}

balance_options stages_of(std::size_t stages) {
  balance_options options;
  options.stages = stages;
  return options;
}

/// The best bottleneck over every split, by brute force.
double brute_force_bottleneck(const std::vector<layer_profile>& profile, std::size_t stages) {
  const std::size_t n = profile.size();
  double best = 1e300;
  // Enumerate split points as bit masks over the n - 1 gaps.
  for (std::uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
    if (static_cast<std::size_t>(__builtin_popcount(mask)) != stages - 1)
      continue;
    double slowest = 0, current = 0;
    for (std::size_t i = 0; i < n; ++i) {
      current += profile[i].total_ms();
      if (i + 1 == n || (mask >> i) & 1u) {
        slowest = std::max(slowest, current);
        current = 0;
      }
    }
    best = std::min(best, slowest);
  }
  return best;
}

TEST(Partition, BalanceListAndSplitPointsAgree) {
  auto a = from_balance({4, 4}, 8);
  auto b = from_split_points({4}, 8);
  EXPECT_EQ(a.boundaries, (std::vector<std::size_t>{0, 4, 8}));
  EXPECT_EQ(a.boundaries, b.boundaries);
  EXPECT_EQ(even(3, 8).boundaries, (std::vector<std::size_t>{0, 3, 6, 8}));
}

TEST(Partition, BadManualPartitionsNameTheProblem) {
  try {
    (void)from_balance({4, 3}, 8);
    FAIL();
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("covers 7 layers but the model has 8"));
  }
  EXPECT_THROW((void)from_split_points({0, 4}, 8), usage_error);
  EXPECT_THROW((void)from_split_points({8}, 8), usage_error);
  EXPECT_THROW((void)even(9, 8), usage_error);
}

TEST(Partition, DynamicProgrammeMatchesBruteForce) {
  const std::vector<std::vector<double>> cases = {
    {1, 1, 1, 1, 8, 8, 1, 1}, {8, 1, 1, 1, 1, 1, 1, 1, 1, 8}, {3, 1, 4, 1, 5, 9, 2, 6, 5, 3},
    {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  for (const auto& ms : cases)
    for (std::size_t stages = 1; stages <= 4; ++stages) {
      auto profile = synthetic(ms);
      auto split = balance_by_profile(profile, stages_of(stages));
      ASSERT_TRUE(split.has_value());
      EXPECT_EQ(split->stages(), stages);
      EXPECT_DOUBLE_EQ(split->bottleneck_ms(), brute_force_bottleneck(profile, stages))
        << to_string(*split);
    }
}

TEST(Partition, UnevenLayersAreBalancedByTime) {
  // Two heavy layers among light ones: an even split by count puts both
  // heavy layers on one stage.
  auto profile = synthetic({1, 1, 1, 1, 8, 8, 1, 1});
  auto split = balance_by_profile(profile, stages_of(2));
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->boundaries, (std::vector<std::size_t>{0, 5, 8}));
  EXPECT_DOUBLE_EQ(split->bottleneck_ms(), 12.0);
  auto by_count = with_prediction(even(2, 8), profile);
  EXPECT_DOUBLE_EQ(by_count.bottleneck_ms(), 18.0);
  EXPECT_EQ(to_string(*split), "stage 0: layers [0, 5), predicted 12.000 ms, 1.0 KiB\n"
                               "stage 1: layers [5, 8), predicted 10.000 ms, 630 B\n");
  EXPECT_EQ(to_string(*split, {12.5, 9.75}),
            "stage 0: layers [0, 5), predicted 12.000 ms, 1.0 KiB, measured 12.500 ms\n"
            "stage 1: layers [5, 8), predicted 10.000 ms, 630 B, measured 9.750 ms\n");
}

TEST(Partition, MemoryCapsMoveLayersToWhereTheyFit) {
  // Equal times; stage 0's cap holds only two layers (2 x 100 x 2 + 2 x 10).
  auto profile = synthetic({1, 1, 1, 1, 1, 1});
  auto options = stages_of(2);
  options.memory_caps = {450, 0};
  auto split = balance_by_profile(profile, options);
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->boundaries, (std::vector<std::size_t>{0, 2, 6}));
  EXPECT_LE(split->predicted_bytes[0], 450u);

  options.memory_caps = {100, 100};
  auto impossible = balance_by_profile(profile, options);
  ASSERT_FALSE(impossible.has_value());
  EXPECT_THAT(impossible.error_value().message(), HasSubstr("fits the memory caps"));

  options.memory_caps = {100};
  auto wrong_count = balance_by_profile(profile, options);
  ASSERT_FALSE(wrong_count.has_value());
  EXPECT_THAT(wrong_count.error_value().message(), HasSubstr("1 memory caps for 2 stages"));
  EXPECT_FALSE(balance_by_profile(profile, stages_of(7)).has_value());
}

TEST(Partition, ProfiledModelWithUnevenWidthsSeparatesTheHeavyLayers) {
  // Linear widths differing 8x: layers 1 and 2 cost 64x the MACs of the
  // narrow ones; the automatic split must not put them on one stage, and it
  // predicts a slowest stage no worse than the split by layer count.
  auto model = std::make_shared<nn::sequential>();
  auto add = [&](std::int64_t in, std::int64_t out) { model->append(nn::make<nn::linear>(in, out, 1)); };
  add(32, 256);
  add(256, 256);
  add(256, 256);
  add(256, 32);
  for (int i = 0; i < 8; ++i)
    add(32, 32);
  generator gen{5};
  auto sample = randn({64, 32}, gen);
  profile_options profiling;
  profiling.repetitions = 20; // the minimum of 20 (~10 ms): robust to a busy machine
  auto profile = profile_layers(*model, sample, profiling);
  ASSERT_EQ(profile.size(), 12u);
  EXPECT_EQ(profile[1].parameter_bytes, (256u * 256u + 256u) * 4u);
  EXPECT_EQ(profile[0].activation_bytes, 64u * 256u * 4u);
  EXPECT_GT(profile[1].total_ms(), profile[5].total_ms());
  for (const auto& p : model->parameters())
    EXPECT_FALSE(p.grad().defined()) << "profiling left a gradient on " << p.name();

  auto split = balance_by_profile(profile, stages_of(2));
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->end(0), 2u) << to_string(*split);
  EXPECT_LE(split->bottleneck_ms(), with_prediction(even(2, 12), profile).bottleneck_ms());
  // The same in one call (timings differ run to run: only the shape is
  // checked here).
  auto three = balance_by_time(*model, sample, stages_of(3));
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->stages(), 3u);
  EXPECT_EQ(three->layers(), 12u);
  EXPECT_EQ(three->predicted_ms.size(), 3u);
}

} // namespace
} // namespace troupe::parallel
