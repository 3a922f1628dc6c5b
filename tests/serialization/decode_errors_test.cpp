// Every way a data-plane message can be wrong: each must be an error value
// with the right code and a message naming the field, never a crash or throw.
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "schema/troupe.capnp.h"
#include "troupe/serialization/decode.hpp"
#include "troupe/serialization/encoded_message.hpp"

using namespace troupe;

namespace {

/// Header fields as raw wire values, so tests can say anything.
struct forged {
  std::uint8_t dtype = 0;
  std::vector<std::int64_t> shape{4, 3};
  std::vector<std::int64_t> strides{3, 1};
  std::uint64_t byte_count = 48;
  std::uint16_t kind = 1;
  std::uint16_t device_kind = 0;
  std::int32_t device_index = 0;
  bool with_tensor = true;
  std::uint16_t landing_kind = 0;
  std::int32_t landing_index = 0;
};

/// A header frame in 8-byte aligned words.
std::vector<std::uint64_t> forge(const forged& f) {
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<wire::TrainingMessage>();
  root.setKind(static_cast<wire::TrainingMessage::Kind>(f.kind));
  root.setDestination("stage-1");
  root.setLandingKind(static_cast<wire::LandingKind>(f.landing_kind));
  root.setLandingIndex(f.landing_index);
  if (f.with_tensor) {
    auto h = root.initTensor();
    h.setDtype(f.dtype);
    auto shape = h.initShape(static_cast<unsigned>(f.shape.size()));
    for (unsigned i = 0; i < f.shape.size(); ++i)
      shape.set(i, f.shape[i]);
    auto strides = h.initStrides(static_cast<unsigned>(f.strides.size()));
    for (unsigned i = 0; i < f.strides.size(); ++i)
      strides.set(i, f.strides[i]);
    h.setByteCount(f.byte_count);
    h.setDeviceKind(static_cast<wire::DeviceKind>(f.device_kind));
    h.setDeviceIndex(f.device_index);
  }
  auto flat = capnp::messageToFlatArray(builder);
  std::vector<std::uint64_t> words(flat.size());
  std::memcpy(words.data(), flat.begin(), flat.size() * 8);
  return words;
}

std::span<const std::byte> bytes_of(const std::vector<std::uint64_t>& words) {
  return std::as_bytes(std::span(words));
}

expected<message_header> decode_forged(const forged& f, const decode_options& options = {}) {
  auto words = forge(f);
  return decode_header(bytes_of(words), options);
}

void expect_error(const expected<message_header>& result, errc code, const std::string& text) {
  ASSERT_FALSE(result) << "expected an error containing: " << text;
  EXPECT_EQ(result.error().code(), code) << result.error().to_string();
  EXPECT_NE(result.error().message().find(text), std::string::npos)
      << "message: " << result.error().message() << "\nwanted: " << text;
}

/// Decoding `bytes` as a flat frame must not crash or throw.
bool decodes_safely(std::span<const std::byte> bytes) {
  std::vector<std::uint64_t> aligned((bytes.size() + 7) / 8);
  if (!bytes.empty())
    std::memcpy(aligned.data(), bytes.data(), bytes.size());
  auto frame = std::as_bytes(std::span(aligned)).first(bytes.size());
  auto decoded = decode_flat(frame, nullptr);
  auto header = decode_header(frame);
  return decoded.has_value() || !decoded.error().message().empty();
}

} // namespace

TEST(DecodeErrors, ForgedValidHeaderDecodes) {
  auto header = decode_forged({});
  ASSERT_TRUE(header) << header.error().to_string();
  EXPECT_EQ(header->shape, (dims{4, 3}));
}

TEST(DecodeErrors, UnknownDtype) {
  forged f;
  f.dtype = 17;
  expect_error(decode_forged(f), errc::unsupported_dtype, "dtype 17 is unknown");
}

TEST(DecodeErrors, NegativeDimension) {
  forged f;
  f.shape = {4, 3, -5};
  f.strides = {3, 1, 1};
  expect_error(decode_forged(f), errc::malformed_message,
               "dimension 2 is -5 but must be in [0, 2^40]");
}

TEST(DecodeErrors, OversizedDimension) {
  forged f;
  f.shape = {std::int64_t{1} << 41, 1};
  expect_error(decode_forged(f), errc::malformed_message, "dimension 0 is 2199023255552");
}

TEST(DecodeErrors, OverflowingElementCount) {
  forged f;
  f.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40, std::int64_t{1} << 40};
  f.strides = {0, 0, 0};
  f.byte_count = 4;
  expect_error(decode_forged(f), errc::size_limit_exceeded, "holds more than the limit");
}

TEST(DecodeErrors, RankAboveTheBound) {
  forged f;
  f.shape.assign(17, 1);
  f.strides.assign(17, 0);
  f.byte_count = 4;
  expect_error(decode_forged(f), errc::size_limit_exceeded, "rank 17 is above the limit 16");
}

TEST(DecodeErrors, StridesOfTheWrongRank) {
  forged f;
  f.strides = {1};
  expect_error(decode_forged(f), errc::malformed_message,
               "strides has 1 entries but shape [4, 3] has rank 2");
}

TEST(DecodeErrors, NegativeOrHugeStride) {
  forged f;
  f.strides = {3, -1};
  expect_error(decode_forged(f), errc::malformed_message, "stride 1 is -1 but must be in [0, 2^40]");
  f.strides = {std::int64_t{1} << 50, 1};
  expect_error(decode_forged(f), errc::malformed_message, "stride 0 is");
}

TEST(DecodeErrors, StridesReachingOutsideThePayload) {
  forged f;
  f.strides = {100, 1};  // addresses element 302, the payload holds 12
  expect_error(decode_forged(f), errc::malformed_message, "byteCount 48 disagrees with shape [4, 3]");
}

TEST(DecodeErrors, ByteCountDisagreesWithShape) {
  forged f;
  f.byte_count = 100;
  expect_error(decode_forged(f), errc::malformed_message,
               "byteCount 100 disagrees with shape [4, 3] of float32 (48 bytes");
}

TEST(DecodeErrors, OversizedPayloadAgainstTheConfiguredLimit) {
  forged f;
  f.shape = {1 << 20, 1024};  // 4 GiB of float32
  f.strides = {1024, 1};
  f.byte_count = std::uint64_t{4} << 30;
  expect_error(decode_forged(f), errc::size_limit_exceeded, "limit of 1073741824 bytes");
  forged lying;
  lying.byte_count = std::uint64_t{1} << 40;
  expect_error(decode_forged(lying), errc::size_limit_exceeded,
               "byteCount 1099511627776 is above the limit 1073741824");
  decode_options small;
  small.max_payload_bytes = 40;
  expect_error(decode_forged(forged{}, small), errc::size_limit_exceeded, "limit of 40 bytes");
}

TEST(DecodeErrors, UnknownKindAndDevice) {
  forged f;
  f.kind = 9;
  expect_error(decode_forged(f), errc::malformed_message, "kind 9 is unknown");
  f = {};
  f.device_kind = 5;
  expect_error(decode_forged(f), errc::malformed_message, "deviceKind 5 is unknown");
  f = {};
  f.device_index = -2;
  expect_error(decode_forged(f), errc::malformed_message, "deviceIndex -2");
}

TEST(DecodeErrors, UnknownOrOutOfRangeLandingDevice) {
  forged f;
  f.landing_kind = 3;
  expect_error(decode_forged(f), errc::malformed_message, "landingKind 3 is unknown");
  f.landing_kind = 2; // cuda
  for (std::int32_t index : {-1, 65536, std::numeric_limits<std::int32_t>::min()}) {
    f.landing_index = index;
    expect_error(decode_forged(f), errc::malformed_message, fmt::format("landingIndex {} but must be", index));
  }
  f.landing_index = 65535;
  auto fine = decode_forged(f);
  ASSERT_TRUE(fine) << fine.error().to_string();
  EXPECT_EQ(fine->meta.landing, device::cuda(65535));
  f = {};
  f.landing_index = -7; // ignored: nothing lands anywhere (asCarried)
  fine = decode_forged(f);
  ASSERT_TRUE(fine) << fine.error().to_string();
  EXPECT_EQ(fine->meta.landing, std::nullopt);
}

TEST(DecodeErrors, MissingTensorHeader) {
  forged f;
  f.with_tensor = false;
  expect_error(decode_forged(f), errc::malformed_message, "no tensor header");
}

TEST(DecodeErrors, TruncatedHeader) {
  auto words = forge({});
  auto bytes = bytes_of(words);
  expect_error(decode_header(bytes.first(4)), errc::malformed_message, "shorter than the 8-byte");
  expect_error(decode_header(bytes.first(bytes.size() - 8)), errc::malformed_message,
               "according to its segment table");
  expect_error(decode_header({}), errc::malformed_message, "header truncated");
}

TEST(DecodeErrors, HugeSegmentTableIsRejectedBeforeReading) {
  std::vector<std::uint64_t> words(4, 0);
  std::uint32_t many = 0x7fffffff;
  std::memcpy(words.data(), &many, 4);
  expect_error(decode_header(bytes_of(words)), errc::malformed_message, "segments but must have");
  std::uint32_t one_huge[2] = {0, 0x10000000};
  std::memcpy(words.data(), one_huge, 8);
  expect_error(decode_header(bytes_of(words)), errc::size_limit_exceeded, "header frame is");
}

TEST(DecodeErrors, GarbagePointersAreMalformedNotCrashes) {
  // A one-segment frame whose root pointer points far outside the segment.
  std::vector<std::uint64_t> words{std::uint64_t{2} << 32, 0x7ffffff0'0000fffcull, 0};
  expect_error(decode_header(bytes_of(words)), errc::malformed_message, "Cap'n Proto rejected");
}

TEST(DecodeErrors, MisalignedHeaderIsCopiedNotRejected) {
  auto message = encode({message_kind::parameters, 1, 2, 3, "x"}, tensor::zeros({4}));
  auto header = message.header_bytes();
  std::vector<std::byte> shifted(header.size() + 1);
  std::memcpy(shifted.data() + 1, header.data(), header.size());
  auto decoded = decode_header(std::span(shifted).subspan(1));
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(decoded->meta.context_id, 3u);
}

TEST(DecodeErrors, MisalignedPayloadIsAnError) {
  auto message = encode({}, tensor::zeros({4}, dtype::float64));
  auto flat = message.to_flat_bytes();
  std::vector<std::uint64_t> storage_words(flat.size() / 8 + 2);
  auto* shifted = reinterpret_cast<std::byte*>(storage_words.data()) + 4;
  std::memcpy(shifted, flat.data(), flat.size());
  auto decoded = decode_flat(std::span<const std::byte>(shifted, flat.size()), nullptr);
  ASSERT_FALSE(decoded);
  EXPECT_EQ(decoded.error().code(), errc::malformed_message);
  EXPECT_NE(decoded.error().message().find("not aligned to 8 bytes for float64"), std::string::npos)
      << decoded.error().message();
}

TEST(DecodeErrors, PayloadShorterOrLongerThanByteCount) {
  auto message = encode({}, tensor::zeros({4, 3}));
  auto flat = message.to_flat_bytes();
  std::vector<std::uint64_t> words(flat.size() / 8 + 2, 0);
  std::memcpy(words.data(), flat.data(), flat.size());
  auto all = std::as_bytes(std::span(words));
  auto shorter = decode_flat(all.first(flat.size() - 4), nullptr);
  ASSERT_FALSE(shorter);
  EXPECT_NE(shorter.error().message().find("payload is 44 bytes but byteCount says 48"),
            std::string::npos);
  auto longer = decode_flat(all.first(flat.size() + 8), nullptr);
  ASSERT_FALSE(longer);
  EXPECT_NE(longer.error().message().find("payload is 56 bytes but byteCount says 48"),
            std::string::npos);

  auto wrong = decode(message.header_bytes(), storage::allocate(40));
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code(), errc::malformed_message);
  EXPECT_NE(wrong.error().message().find("payload is 40 bytes"), std::string::npos);
}

TEST(DecodeErrors, OversizedHeaderAgainstTheConfiguredLimit) {
  auto message = encode({message_kind::control, 0, 0, 0, std::string(4096, 'a')}, tensor::zeros({1}));
  decode_options options;
  options.max_header_bytes = 1024;
  auto decoded = decode_header(message.header_bytes(), options);
  ASSERT_FALSE(decoded);
  EXPECT_EQ(decoded.error().code(), errc::size_limit_exceeded);
}

// Mutation sweep, independent of libFuzzer: a small valid message, every
// single-bit flip of every byte, every truncation, and seeded random noise.
TEST(DecodeMutations, EveryByteFlipAndTruncationIsSafe) {
  auto message = encode({message_kind::forward_activation, 5, 1, 9, "s"},
                        tensor::from<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  auto flat = message.to_flat_bytes();
  for (std::size_t i = 0; i < flat.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      auto copy = flat;
      copy[i] ^= static_cast<std::byte>(1 << bit);
      ASSERT_TRUE(decodes_safely(copy)) << "flip at " << i;
    }
  for (std::size_t length = 0; length <= flat.size(); ++length) {
    auto result = decode_flat(std::span(flat).first(length), nullptr);
    if (length < flat.size()) {
      EXPECT_FALSE(result) << "truncated to " << length;
    }
  }
}

TEST(DecodeMutations, RandomNoiseIsSafe) {
  std::mt19937_64 random(20240611);
  auto message = encode({message_kind::gradient_bucket, 5, 1, 9, "reducer"},
                        tensor::zeros({3, 2, 2}, dtype::int64));
  auto flat = message.to_flat_bytes();
  for (int round = 0; round < 20000; ++round) {
    auto copy = flat;
    auto edits = 1 + random() % 8;
    for (std::uint64_t e = 0; e < edits; ++e)
      copy[random() % copy.size()] = static_cast<std::byte>(random());
    if (random() % 4 == 0)
      copy.resize(random() % (copy.size() + 1));
    ASSERT_TRUE(decodes_safely(copy)) << "round " << round;
  }
  for (int round = 0; round < 2000; ++round) {
    std::vector<std::byte> noise(random() % 256);
    for (auto& b : noise)
      b = static_cast<std::byte>(random());
    if (noise.size() >= 4 && random() % 2) {
      std::uint32_t zero = 0;  // a plausible one-segment table
      std::memcpy(noise.data(), &zero, 4);
    }
    ASSERT_TRUE(decodes_safely(noise)) << "noise round " << round;
  }
}
