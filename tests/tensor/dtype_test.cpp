// bfloat16 rounding and conversions between every pair of dtypes.
#include <bit>
#include <cmath>
#include <limits>

#include "test_util.hpp"

namespace troupe {
namespace {

std::uint16_t bits_of(float value) {
  return bfloat16(value).bits;
}

TEST(Bfloat16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(bits_of(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between 0x3f80 and 0x3f81: the even one wins.
  EXPECT_EQ(bits_of(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  // 0x3f818000 lies between 0x3f81 (odd) and 0x3f82 (even).
  EXPECT_EQ(bits_of(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  // Just above and below the halfway point.
  EXPECT_EQ(bits_of(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bits_of(std::bit_cast<float>(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(bits_of(-2.0f), 0xc000);
  EXPECT_EQ(bits_of(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(NAN))));
  EXPECT_EQ(static_cast<float>(bfloat16(3.140625f)), 3.140625f); // exactly representable
}

TEST(Bfloat16, TensorConversionsGiveTheScalarRulesBitsForEveryPattern) {
  // Where the CPU has AVX2 a contiguous float32 <-> bfloat16 conversion runs
  // in AVX2 or AVX-512 lanes (tensor/src/cpu_vector_bits*.cpp; ctest runs
  // this test on each copy the CPU has): every bfloat16
  // pattern, and every float32 whose low half is a rounding case (zero,
  // below, at and above the tie, all ones), must get the scalar rule's bits.
  // Lengths that leave a partial vector at the end are cut from the same
  // data.
  std::vector<std::uint32_t> low_halves{0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234};
  std::vector<float> floats;
  for (std::uint32_t high = 0; high <= 0xffff; ++high)
    for (auto low : low_halves)
      floats.push_back(std::bit_cast<float>(high << 16 | low));
  for (std::size_t length : {floats.size(), std::size_t{1}, std::size_t{15}, std::size_t{17}, std::size_t{41}}) {
    const std::vector<float> part(floats.begin(), floats.begin() + static_cast<std::ptrdiff_t>(length));
    const auto narrow = tensor::from(part, {static_cast<std::int64_t>(length)}).to(dtype::bfloat16);
    const auto got = narrow.to_vector<bfloat16>();
    ASSERT_EQ(got.size(), length);
    std::size_t differing = 0;
    for (std::size_t i = 0; i < length; ++i)
      differing += got[i].bits != bits_of(part[i]);
    EXPECT_EQ(differing, 0u) << "float32 -> bfloat16, " << length << " elements";
  }

  std::vector<bfloat16> every(0x10000);
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits)
    every[bits].bits = static_cast<std::uint16_t>(bits);
  auto wide = tensor::empty({0x10000}, dtype::bfloat16);
  std::copy(every.begin(), every.end(), wide.data<bfloat16>());
  for (std::int64_t length : {std::int64_t{0x10000}, std::int64_t{3}, std::int64_t{13}}) {
    const auto got = wide.slice(0, 0, length).to(dtype::float32).to_vector<float>();
    std::size_t differing = 0;
    for (std::int64_t i = 0; i < length; ++i)
      differing += std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(i)]) !=
                   std::bit_cast<std::uint32_t>(static_cast<float>(every[static_cast<std::size_t>(i)]));
    EXPECT_EQ(differing, 0u) << "bfloat16 -> float32, " << length << " elements";
  }
}

TEST(Bfloat16, LargeConversionsKeepTheScalarRulesBits) {
  // From 4 MiB of output on, the vector kernels write with streaming stores
  // from the output's first 32-byte (AVX-512 float32: 64-byte) boundary
  // (cpu_vector_bits*.cpp): both
  // directions, into views that start off that boundary, with a partial
  // vector at the end, must still give the scalar rule's bits.
  const std::int64_t n = (std::int64_t{1} << 21) + 37;
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) // every exponent, rounding cases and NaNs among them
    values[static_cast<std::size_t>(i)] = std::bit_cast<float>(static_cast<std::uint32_t>(i) * 2654435761u);
  auto narrow_storage = tensor::empty({n + 1}, dtype::bfloat16);
  auto narrow = narrow_storage.slice(0, 1, n + 1);
  narrow.copy_from(tensor::from(values, {n}));
  const auto* narrowed = narrow.data<bfloat16>();
  std::int64_t differing = 0;
  for (std::int64_t i = 0; i < n; ++i)
    differing += narrowed[i].bits != bits_of(values[static_cast<std::size_t>(i)]);
  EXPECT_EQ(differing, 0) << "float32 -> bfloat16";

  auto wide_storage = tensor::empty({n + 3}, dtype::float32);
  auto wide = wide_storage.slice(0, 3, n + 3);
  wide.copy_from(narrow);
  const auto* widened = wide.data<float>();
  differing = 0;
  for (std::int64_t i = 0; i < n; ++i)
    differing += std::bit_cast<std::uint32_t>(widened[i]) != static_cast<std::uint32_t>(narrowed[i].bits) << 16;
  EXPECT_EQ(differing, 0) << "bfloat16 -> float32";
}

TEST(Dtype, ConversionsBetweenAllDtypesKeepSmallIntegers) {
  const std::vector<dtype> all{dtype::float32, dtype::float64, dtype::int64,
                               dtype::int32,   dtype::uint8,   dtype::bfloat16};
  auto source = test::make({0, 1, 2, 7, 100, 255}, {2, 3});
  for (auto from : all)
    for (auto to : all) {
      auto converted = source.to(from).to(to);
      EXPECT_EQ(converted.type(), to);
      EXPECT_EQ(converted.shape(), source.shape());
      EXPECT_EQ(test::values(converted), test::values(source))
          << "from " << name_of(from) << " to " << name_of(to);
    }
}

TEST(Dtype, FloatToIntegerTruncatesAndBfloat16Rounds) {
  auto f = test::make({1.75, -1.75, 257.0}, {3});
  EXPECT_EQ(f.to(dtype::int64).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, -1, 257}));
  // 257 needs 9 significant bits; bfloat16 has 8, and the tie goes to even.
  EXPECT_EQ(f.to(dtype::bfloat16).to_vector<double>(), (std::vector<double>{1.75, -1.75, 256.0}));
  EXPECT_EQ(size_of(dtype::bfloat16), 2u);
  EXPECT_EQ(dtype_from_wire(6), std::nullopt);
  EXPECT_EQ(dtype_from_wire(5), dtype::bfloat16);
}

TEST(Dtype, FloatingOpsRejectStorageOnlyDtypes) {
  auto b = tensor::zeros({2}, dtype::bfloat16);
  EXPECT_THAT(test::usage_error_of([&] { (void)exp(b); }),
              testing::HasSubstr("exp: expected float32 or float64, got bfloat16"));
  EXPECT_EQ(test::values(exp(b.to(dtype::float32))), (std::vector<double>{1.0, 1.0}));
}

} // namespace
} // namespace troupe
