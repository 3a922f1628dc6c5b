// Checkpoint files: round trips, atomic saves, and every way a file can be bad.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "troupe/serialization/checkpoint_file.hpp"
#include "troupe/serialization/checksum.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

/// A fresh directory per test, removed afterwards.
class CheckpointFile : public ::testing::Test {
protected:
  void SetUp() override {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("troupe_ckpt_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

tensor patterned(const dims& shape, dtype type) {
  auto t = tensor::empty(shape, type);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i)
    p[i] = static_cast<unsigned char>(i * 13 + 1);
  return t;
}

named_tensors sample_state() {
  named_tensors state;
  state.emplace_back("embedding.weight", patterned({7, 5}, dtype::bfloat16));
  state.emplace_back("layer0.weight", patterned({5, 3}, dtype::float32));
  state.emplace_back("layer0.bias", patterned({3}, dtype::float64));
  state.emplace_back("step", tensor::scalar(1234, dtype::int64));
  state.emplace_back("mask", patterned({9}, dtype::uint8));
  state.emplace_back("counts", patterned({2, 2}, dtype::int32));
  state.emplace_back("empty", tensor::empty({0, 4}, dtype::float32));
  state.emplace_back("transposed", patterned({3, 4}, dtype::float32).t());
  return state;
}

std::vector<char> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_all(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool same_elements(const tensor& a, const tensor& b) {
  if (a.type() != b.type() || a.shape() != b.shape())
    return false;
  auto ca = a.contiguous();
  auto cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

} // namespace

TEST(Checksum, MatchesTheCastagnoliCheckValue) {
  const char* text = "123456789";
  EXPECT_EQ(crc32c(0, std::as_bytes(std::span(text, 9))), 0xE3069283u);
  // Incremental equals one-shot.
  auto part = crc32c(0, std::as_bytes(std::span(text, 4)));
  EXPECT_EQ(crc32c(part, std::as_bytes(std::span(text + 4, 5))), 0xE3069283u);
}

// ISA-L folds 16 to 256 bytes at a time and finishes the tail apart; every
// length around those blocks' edges, whole or in two parts, must give the
// bit-by-bit definition's value.
TEST(Checksum, LongBuffersMatchTheBitByBitDefinition) {
  auto reference = [](std::span<const std::byte> bytes) {
    std::uint32_t crc = 0xFFFFFFFFu;
    for (auto b : bytes) {
      crc ^= static_cast<std::uint32_t>(b);
      for (int bit = 0; bit < 8; ++bit)
        crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    }
    return ~crc;
  };
  std::vector<std::byte> bytes(3 * 3 * 4096 + 29);
  std::uint64_t state = 88172645463325252u; // xorshift: no pattern for a chain to miss
  for (auto& b : bytes) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    b = static_cast<std::byte>(state >> 24);
  }
  for (std::size_t n : {0, 1, 7, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025, 3 * 4096 - 1, 3 * 4096,
                        3 * 4096 + 1, 2 * 3 * 4096 + 8, 3 * 3 * 4096 + 29}) {
    auto head = std::span<const std::byte>(bytes).first(n);
    EXPECT_EQ(crc32c(0, head), reference(head)) << n << " bytes";
    auto part = crc32c(0, head.first(n / 3));
    EXPECT_EQ(crc32c(part, head.subspan(n / 3)), reference(head)) << n << " bytes in two parts";
  }
  bytes[5000] ^= std::byte{1}; // one bit in the middle of a block
  EXPECT_EQ(crc32c(0, bytes), reference(bytes));
}

// ISA-L takes an int length, so a buffer past 1 GiB is hashed in calls of at
// most 1 GiB; past 4 GiB a length that wrapped would hash a few bytes only.
// The result must equal two parts combined. calloc'd pages that are never
// written read as the shared zero page, so this costs no memory.
TEST(Checksum, ABufferPastFourGibibytesEqualsItsPartsCombined) {
  constexpr std::size_t gib = std::size_t{1} << 30;
  constexpr std::size_t size = 4 * gib + 4096 + 3;
  std::unique_ptr<std::byte, decltype(&std::free)> buffer(static_cast<std::byte*>(std::calloc(size, 1)), &std::free);
  ASSERT_NE(buffer, nullptr);
  std::span<std::byte> bytes(buffer.get(), size);
  for (std::size_t at : {gib - 2, gib, gib + 1, 2 * gib + 4000, 4 * gib + 1, size - 1})
    bytes[at] = static_cast<std::byte>(0x5a + at % 7);
  const std::size_t cut = gib + 3000;
  const auto combined = crc32c_combine(crc32c(0, bytes.first(cut)), crc32c(0, bytes.subspan(cut)), size - cut);
  EXPECT_EQ(crc32c(0, bytes), combined);
}

TEST(Checksum, CombiningPiecesEqualsTheChecksumOfTheWhole) {
  std::vector<std::byte> bytes(4099);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  const auto whole = crc32c(0, bytes);
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{8}, std::size_t{1000}, bytes.size() - 1,
                          bytes.size()}) {
    auto a = std::span(bytes).first(cut);
    auto b = std::span(bytes).subspan(cut);
    EXPECT_EQ(crc32c_combine(crc32c(0, a), crc32c(0, b), b.size()), whole) << "cut at " << cut;
  }
  EXPECT_NE(crc32c_combine(crc32c(0, std::span(bytes).first(10)), crc32c(0, std::span(bytes).subspan(10)), 4000),
            whole) << "a wrong length must not combine to the whole";
}

TEST_F(CheckpointFile, RoundTripsEveryDtypeNameOrderAndMetadata) {
  auto path = dir_ / "model.ckpt";
  auto state = sample_state();
  checkpoint_metadata metadata{{"step", "1234"}, {"config", "{\"layers\": 2}"}, {"empty", ""}};
  auto saved = save_checkpoint(path, state, metadata);
  ASSERT_TRUE(saved) << saved.error().to_string();
  EXPECT_FALSE(fs::exists(dir_ / "model.ckpt.tmp"));

  auto loaded = read_checkpoint(path);
  ASSERT_TRUE(loaded) << loaded.error().to_string();
  ASSERT_EQ(loaded->tensors.size(), state.size());
  for (std::size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(loaded->tensors[i].first, state[i].first);
    EXPECT_TRUE(same_elements(loaded->tensors[i].second, state[i].second)) << state[i].first;
  }
  EXPECT_EQ(loaded->metadata, metadata);
  EXPECT_EQ(find_tensor(loaded->tensors, "step").item(), 1234.0);
  EXPECT_EQ(find_tensor(loaded->tensors, "embedding.weight").type(), dtype::bfloat16);
  EXPECT_EQ(find_tensor(loaded->tensors, "step").type(), dtype::int64);

  auto plain = load_checkpoint(path);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->size(), state.size());
}

TEST_F(CheckpointFile, LoadedTensorsAliasOneAlignedFileBuffer) {
  auto path = dir_ / "aliased.ckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_state()));
  auto loaded = load_checkpoint(path);
  ASSERT_TRUE(loaded);
  const auto& first = (*loaded)[0].second;
  for (const auto& [name, value] : *loaded) {
    EXPECT_TRUE(value.shares_storage_with(first)) << name;
    if (value.numel() > 0) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(value.raw_data()) % 64, 0u) << name;
    }
  }
}

TEST_F(CheckpointFile, EmptyStateRoundTrips) {
  auto path = dir_ / "empty.ckpt";
  ASSERT_TRUE(save_checkpoint(path, {}));
  auto loaded = load_checkpoint(path);
  ASSERT_TRUE(loaded) << loaded.error().to_string();
  EXPECT_TRUE(loaded->empty());
}

TEST_F(CheckpointFile, OverwritesAnExistingCheckpoint) {
  auto path = dir_ / "model.ckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_state()));
  named_tensors next{{"only", tensor::full({2}, 3.0)}};
  ASSERT_TRUE(save_checkpoint(path, next));
  auto loaded = load_checkpoint(path);
  ASSERT_TRUE(loaded);
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_EQ((*loaded)[0].second.to_vector<float>(), (std::vector<float>{3, 3}));
}

TEST_F(CheckpointFile, TruncationAtAnyLengthIsAnError) {
  auto path = dir_ / "model.ckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_state()));
  auto bytes = read_all(path);
  auto cut = dir_ / "cut.ckpt";
  for (std::size_t length : {std::size_t{0}, std::size_t{7}, std::size_t{31}, std::size_t{40},
                             std::size_t{100}, bytes.size() / 2, bytes.size() - 9,
                             bytes.size() - 1}) {
    write_all(cut, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(length)));
    auto loaded = load_checkpoint(cut);
    ASSERT_FALSE(loaded) << "length " << length;
    EXPECT_EQ(loaded.error().code(), errc::malformed_message) << loaded.error().to_string();
    EXPECT_NE(loaded.error().message().find(cut.string()), std::string::npos);
  }
}

TEST_F(CheckpointFile, EveryTruncationOfTheBytesIsAnError) {
  auto path = dir_ / "model.ckpt";
  ASSERT_TRUE(save_checkpoint(path, {{"w", patterned({3}, dtype::float32)}}));
  auto bytes = read_all(path);
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    auto parsed = parse_checkpoint(std::as_bytes(std::span(bytes.data(), length)));
    ASSERT_FALSE(parsed) << "length " << length;
  }
}

TEST_F(CheckpointFile, AFlippedByteAnywhereIsDetected) {
  auto path = dir_ / "model.ckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_state()));
  auto bytes = read_all(path);
  // One flip in the index, the payload region and the trailer go through the
  // file; every position goes through parse_checkpoint.
  auto flipped = bytes;
  flipped[bytes.size() - 20] ^= 0x10;
  auto corrupt = dir_ / "corrupt.ckpt";
  write_all(corrupt, flipped);
  auto loaded = load_checkpoint(corrupt);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code(), errc::checksum_mismatch);
  EXPECT_NE(loaded.error().message().find("checksum"), std::string::npos);

  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto copy = bytes;
    copy[i] ^= 0x01;
    auto parsed = parse_checkpoint(std::as_bytes(std::span(copy)));
    EXPECT_FALSE(parsed) << "flip at " << i;
  }
}

TEST_F(CheckpointFile, WrongMagicAndVersionAreRejected) {
  auto path = dir_ / "model.ckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_state()));
  auto bytes = read_all(path);
  auto bad = bytes;
  bad[0] = 'X';
  write_all(path, bad);
  auto loaded = load_checkpoint(path);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code(), errc::malformed_message);
  EXPECT_NE(loaded.error().message().find("wrong magic"), std::string::npos);

  bad = bytes;
  bad[8] = 9;
  write_all(path, bad);
  loaded = load_checkpoint(path);
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().message().find("version is 9 but must be 1"), std::string::npos);
}

TEST_F(CheckpointFile, HugeAnnouncedSizesAreRejectedBeforeAllocating) {
  auto path = dir_ / "model.ckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_state()));
  auto bytes = read_all(path);
  auto bad = bytes;
  std::uint64_t huge = std::uint64_t{1} << 62;
  std::memcpy(bad.data() + 24, &huge, sizeof huge);
  write_all(path, bad);
  auto loaded = load_checkpoint(path);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code(), errc::malformed_message);
  EXPECT_NE(loaded.error().message().find("disagree with the file length"), std::string::npos);
}

TEST_F(CheckpointFile, MissingFileIsAnIoErrorNamingThePath) {
  auto path = dir_ / "nope.ckpt";
  auto loaded = load_checkpoint(path);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code(), errc::io_error);
  EXPECT_NE(loaded.error().message().find(path.string()), std::string::npos);
  EXPECT_NE(loaded.error().message().find("No such file"), std::string::npos);

  auto directory = load_checkpoint(dir_);
  ASSERT_FALSE(directory);
  EXPECT_EQ(directory.error().code(), errc::io_error);
}

TEST_F(CheckpointFile, FailedSaveLeavesTheOriginalUntouched) {
  auto path = dir_ / "model.ckpt";
  ASSERT_TRUE(save_checkpoint(path, sample_state()));
  auto before = read_all(path);
  // The temporary path is taken by a directory: creating it fails (works
  // even as root, unlike a read-only directory).
  fs::create_directories(dir_ / "model.ckpt.tmp");
  auto saved = save_checkpoint(path, {{"other", tensor::zeros({4})}});
  ASSERT_FALSE(saved);
  EXPECT_EQ(saved.error().code(), errc::io_error);
  EXPECT_NE(saved.error().message().find("model.ckpt.tmp"), std::string::npos);
  EXPECT_EQ(read_all(path), before);
  ASSERT_TRUE(load_checkpoint(path));
}

TEST_F(CheckpointFile, SavingOntoADirectoryFailsAndCleansUp) {
  auto target = dir_ / "taken";
  fs::create_directories(target / "inside");
  auto saved = save_checkpoint(target, sample_state());
  ASSERT_FALSE(saved);
  EXPECT_EQ(saved.error().code(), errc::io_error);
  EXPECT_NE(saved.error().message().find(target.string()), std::string::npos);
  EXPECT_TRUE(fs::is_directory(target / "inside"));
  EXPECT_FALSE(fs::exists(dir_ / "taken.tmp"));
}

TEST_F(CheckpointFile, SavingIntoAMissingDirectoryFails) {
  auto saved = save_checkpoint(dir_ / "missing" / "model.ckpt", sample_state());
  ASSERT_FALSE(saved);
  EXPECT_EQ(saved.error().code(), errc::io_error);
}

TEST_F(CheckpointFile, DuplicateNamesAreRejectedOnLoad) {
  auto path = dir_ / "dup.ckpt";
  ASSERT_TRUE(save_checkpoint(path, {{"w", tensor::zeros({2})}, {"w", tensor::ones({2})}}));
  auto loaded = load_checkpoint(path);
  ASSERT_FALSE(loaded);
  EXPECT_NE(loaded.error().message().find("'w' appears twice"), std::string::npos);
}

TEST_F(CheckpointFile, TensorLimitIsEnforced) {
  auto path = dir_ / "big.ckpt";
  ASSERT_TRUE(save_checkpoint(path, {{"w", tensor::zeros({1024})}}));
  checkpoint_options options;
  options.max_tensor_bytes = 1000;
  auto loaded = load_checkpoint(path, options);
  ASSERT_FALSE(loaded);
  EXPECT_EQ(loaded.error().code(), errc::size_limit_exceeded);
  EXPECT_NE(loaded.error().message().find("tensor 'w'"), std::string::npos);
}
