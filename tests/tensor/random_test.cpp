// Philox known answers (Random123's kat_vectors) and the stream contract:
// a draw depends only on (seed, offset), never on what was drawn before.
#include <cmath>
#include <cstring>

#include "test_util.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe {
namespace {

using test::values;

TEST(Philox, KnownAnswerZeroCounterZeroKey) {
  auto out = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(out, (std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
}

TEST(Philox, KnownAnswerAllOnes) {
  auto out = philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff});
  EXPECT_EQ(out, (std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
}

TEST(Philox, KnownAnswerPiDigits) {
  auto out = philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0});
  EXPECT_EQ(out, (std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Generator, RandUsesOneCounterPerElementFromTheTop24Bits) {
  generator gen{0x1234, 7};
  auto t = rand({3}, gen);
  for (std::uint64_t i = 0; i < 3; ++i) {
    auto words = philox4x32({static_cast<std::uint32_t>(7 + i), 0, 0, 0}, {0x1234, 0});
    EXPECT_EQ(t.to_vector<float>()[i], static_cast<float>(words[0] >> 8) * 0x1.0p-24f);
  }
  EXPECT_EQ(gen.offset, 10u);
}

/// Element i's words, from the public bijection: what every fill must draw,
/// whether its counters ran eight at a time in vector lanes or one by one.
std::array<std::uint32_t, 4> words_of(std::uint64_t seed, std::uint64_t position) {
  return philox4x32({static_cast<std::uint32_t>(position), static_cast<std::uint32_t>(position >> 32), 0, 0},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

TEST(Generator, EveryFillDrawsItsElementsWordsAcrossTheCounterCarryAndAPartialVector) {
  // 2,053 elements: two whole chunks of the vector path's 1,024, then 5;
  // the counters cross 2^32, where the low word wraps inside a vector.
  const std::uint64_t seed = 0x0123456789abcdefULL, start = (std::uint64_t{1} << 32) - 13;
  const std::int64_t n = 2053;
  generator g32{seed, start}, g64{seed, start}, gdrop{seed, start}, gint{seed, start};
  const auto f32 = rand({n}, g32, -0.5, 0.5).to_vector<float>();
  const auto f64 = rand({n}, g64, -0.5, 0.5, dtype::float64).to_vector<double>();
  const auto mask = dropout_mask({n}, 0.3, gdrop).to_vector<float>();
  const auto ints = randint({n}, gint, -7, 1000).to_vector<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto w = words_of(seed, start + static_cast<std::uint64_t>(i));
    const float u24 = static_cast<float>(w[0] >> 8) * 0x1.0p-24f;
    const double u53 = static_cast<double>(((std::uint64_t{w[0]} << 32) | w[1]) >> 11) * 0x1.0p-53;
    ASSERT_EQ(f32[i], -0.5f + 1.0f * u24) << "float32 element " << i;
    ASSERT_EQ(f64[i], -0.5 + 1.0 * u53) << "float64 element " << i;
    ASSERT_EQ(mask[i], u24 >= 0.3f ? static_cast<float>(1.0 / 0.7) : 0.0f) << "dropout element " << i;
    const auto bits = (std::uint64_t{w[0]} << 32) | w[1];
    ASSERT_EQ(ints[i], -7 + static_cast<std::int64_t>(bits % 1007)) << "randint element " << i;
  }
}

TEST(Generator, SameSeedAndOffsetGiveTheSameTensorWhateverCameBefore) {
  generator a{42, 0};
  generator b{42, 0};
  (void)rand({5}, b); // b has drawn before; rewind only its offset
  b.offset = 0;
  EXPECT_EQ(rand({4, 3}, a).to_vector<float>(), rand({4, 3}, b).to_vector<float>());
}

TEST(Generator, TwoDrawsOfTenEqualOneDrawOfTwenty) {
  for (auto type : {dtype::float32, dtype::float64}) {
    generator split{9, 100};
    generator whole{9, 100};
    auto first = values(rand({10}, split, 0.0, 1.0, type));
    auto second = values(rand({10}, split, 0.0, 1.0, type));
    auto all = values(rand({20}, whole, 0.0, 1.0, type));
    first.insert(first.end(), second.begin(), second.end());
    EXPECT_EQ(first, all);
    EXPECT_EQ(split.offset, whole.offset);

    generator nsplit{9, 0};
    generator nwhole{9, 0};
    auto n1 = values(randn({10}, nsplit, 0.0, 1.0, type));
    auto n2 = values(randn({10}, nsplit, 0.0, 1.0, type));
    n1.insert(n1.end(), n2.begin(), n2.end());
    EXPECT_EQ(n1, values(randn({20}, nwhole, 0.0, 1.0, type)));
  }
}

TEST(Generator, UniformLiesInTheHalfOpenIntervalWithTheRightMoments) {
  generator gen{3, 0};
  auto v = values(rand({20000}, gen, -2.0, 3.0));
  double total = 0;
  for (auto x : v) {
    ASSERT_GE(x, -2.0);
    ASSERT_LT(x, 3.0);
    total += x;
  }
  EXPECT_NEAR(total / static_cast<double>(v.size()), 0.5, 0.05);
}

TEST(Generator, NormalHasTheRequestedMeanAndDeviation) {
  generator gen{4, 0};
  auto v = values(randn({20000}, gen, 1.0, 2.0, dtype::float64));
  double total = 0;
  double squares = 0;
  for (auto x : v) {
    total += x;
    squares += x * x;
  }
  const double n = static_cast<double>(v.size());
  const double m = total / n;
  EXPECT_NEAR(m, 1.0, 0.05);
  EXPECT_NEAR(std::sqrt(squares / n - m * m), 2.0, 0.05);
}

TEST(Generator, RandintCoversTheIntervalAndIsInt64) {
  generator gen{5, 0};
  auto t = randint({1000}, gen, -3, 4);
  EXPECT_EQ(t.type(), dtype::int64);
  std::vector<int> seen(7, 0);
  for (auto x : t.to_vector<std::int64_t>()) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    ++seen[static_cast<std::size_t>(x + 3)];
  }
  for (auto count : seen)
    EXPECT_GT(count, 0);
  EXPECT_THAT(test::usage_error_of([&] { (void)randint({2}, gen, 3, 3); }),
              testing::HasSubstr("randint"));
}

TEST(Generator, DropoutMaskKeepsWithProbabilityOneMinusPAndScales) {
  generator gen{6, 0};
  auto mask = values(dropout_mask({10000}, 0.25, gen));
  int kept = 0;
  for (auto x : mask) {
    if (x != 0.0) {
      EXPECT_FLOAT_EQ(x, 1.0 / 0.75);
      ++kept;
    }
  }
  EXPECT_NEAR(kept / 10000.0, 0.75, 0.02);
  EXPECT_EQ(gen.offset, 10000u);
  // Replaying the stream replays the mask (recomputation relies on it).
  generator replay{6, 0};
  EXPECT_EQ(values(dropout_mask({10000}, 0.25, replay)), mask);
}

TEST(Generator, ForkGivesIndependentStreamsPerSalt) {
  generator root{11, 0};
  auto a = root.fork(stable_hash("layer1.weight", 13));
  auto b = root.fork(stable_hash("layer2.weight", 13));
  EXPECT_NE(a.seed, b.seed);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(root.fork(1).seed, root.fork(1).seed);
  EXPECT_NE(values(rand({4}, a)), values(rand({4}, b)));
}

TEST(Generator, StableHashIsFnv1a) {
  EXPECT_EQ(stable_hash("", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(stable_hash("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(stable_hash("foobar", 6), 0x85944171f73967e8ULL);
}

TEST(Generator, ManualSeedResetsTheDefaultStream) {
  manual_seed(77);
  auto first = values(rand({6}, default_generator()));
  EXPECT_EQ(default_generator().offset, 6u);
  manual_seed(77);
  EXPECT_EQ(default_generator().seed, 77u);
  EXPECT_EQ(default_generator().offset, 0u);
  EXPECT_EQ(values(rand({6}, default_generator())), first);
}

} // namespace
} // namespace troupe
