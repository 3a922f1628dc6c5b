// The manifest and shard files are untrusted input: every way they can be
// bad is an error naming what was wrong, never a crash, a huge allocation
// or a half-loaded tensor.
#include <fstream>
#include <iterator>

#include "sharded_checkpoint_support.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/serialization/checksum.hpp"

using namespace troupe;
using namespace troupe::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars{std::istreambuf_iterator<char>(in), {}};
  auto bytes = std::as_bytes(std::span(chars));
  return {bytes.begin(), bytes.end()};
}

void write_bytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// A committed checkpoint of "w" (float32 [4, 6], rows 0-1 in rank-0.shard,
/// rows 2-3 in rank-1.shard); tests then forge its manifest or shards.
class UntrustedCheckpoint : public CheckpointDirectory {
protected:
  void SetUp() override {
    CheckpointDirectory::SetUp();
    std::vector<shard_writer> writers{{root_, 1, "rank-0"}, {root_, 1, "rank-1"}};
    auto pieces = split("w", patterned({4, 6}, dtype::float32), 0, 2);
    writers[0].add(pieces[0]);
    writers[1].add(pieces[1]);
    auto committed = commit_checkpoint(root_, write_all(writers), {.step = 1, .metadata = {{"data_position", "7"}}});
    ASSERT_TRUE(committed) << committed.error().to_string();
    dir_ = *committed;
    auto reader = checkpoint_reader::open(dir_);
    ASSERT_TRUE(reader);
    manifest_ = reader->manifest();
  }

  /// Writes `manifest` in place of the real one and opens the checkpoint.
  expected<checkpoint_reader> open_forged(const checkpoint_manifest& manifest, const manifest_options& options = {}) {
    write_bytes(dir_ / "manifest", encode_manifest(manifest));
    return checkpoint_reader::open(dir_, options);
  }

  /// The manifest with `edit` applied to piece `index` of "w".
  template <class Edit> checkpoint_manifest with_piece(std::size_t index, Edit edit) {
    auto forged = manifest_;
    edit(forged.tensors[0].pieces[index]);
    return forged;
  }

  fs::path dir_;
  checkpoint_manifest manifest_;
};

/// `result` is an error of `code` whose message contains `text`.
template <class T> void expect_error(const expected<T>& result, errc code, std::string_view text) {
  ASSERT_FALSE(result.has_value()) << "expected an error containing: " << text;
  EXPECT_EQ(result.error().code(), code) << result.error().to_string();
  EXPECT_NE(result.error().message().find(text), std::string::npos) << result.error().to_string();
}

} // namespace

TEST_F(UntrustedCheckpoint, TheForgeryBaselineOpens) {
  auto reader = open_forged(manifest_);
  ASSERT_TRUE(reader) << reader.error().to_string();
  EXPECT_TRUE(reader->verify());
}

TEST_F(UntrustedCheckpoint, EveryTruncationIsAnError) {
  auto image = encode_manifest(manifest_);
  for (std::size_t length = 0; length < image.size(); ++length) {
    auto parsed = parse_manifest(std::span(image).first(length));
    ASSERT_FALSE(parsed) << "length " << length;
    EXPECT_EQ(parsed.error().code(), errc::malformed_message) << parsed.error().to_string();
  }
  write_bytes(dir_ / "manifest", std::span(image).first(image.size() / 2));
  auto reader = checkpoint_reader::open(dir_);
  expect_error(reader, errc::malformed_message, (dir_ / "manifest").string());
}

TEST_F(UntrustedCheckpoint, EveryFlippedByteIsAnError) {
  auto image = encode_manifest(manifest_);
  for (std::size_t i = 0; i < image.size(); ++i) {
    auto garbled = image;
    garbled[i] ^= std::byte{0x5a};
    EXPECT_FALSE(parse_manifest(garbled)) << "byte " << i;
  }
}

TEST_F(UntrustedCheckpoint, AGarbledFrameWithAValidChecksumIsAnError) {
  auto image = encode_manifest(manifest_);
  for (std::size_t i = 24; i + 8 < image.size(); i += 3)
    image[i] = static_cast<std::byte>(i * 37);
  auto body = std::span(image).first(image.size() - 8);
  auto crc = crc32c(0, body);
  std::memcpy(image.data() + body.size(), &crc, 4);
  auto parsed = parse_manifest(image);
  ASSERT_FALSE(parsed);
  EXPECT_NE(parsed.error().code(), errc::checksum_mismatch) << parsed.error().to_string();
}

TEST_F(UntrustedCheckpoint, WrongMagicAndAbsurdFrameSizesAreRefusedBeforeReading) {
  auto image = encode_manifest(manifest_);
  auto wrong_magic = image;
  wrong_magic[0] = std::byte{'X'};
  expect_error(parse_manifest(wrong_magic), errc::malformed_message, "wrong magic");
  auto absurd = image;
  std::uint64_t huge = std::uint64_t{1} << 60;
  std::memcpy(absurd.data() + 16, &huge, 8);
  write_bytes(dir_ / "manifest", absurd);
  expect_error(checkpoint_reader::open(dir_), errc::size_limit_exceeded, "manifest frame is 1152921504606846976 bytes");
}

TEST_F(UntrustedCheckpoint, APieceOutsideTheGlobalShapeIsAnError) {
  auto forged = with_piece(1, [](checkpoint_piece& p) { p.offset = {3, 0}; });
  expect_error(open_forged(forged), errc::malformed_message,
               "tensor 'w' piece 1 (offset [3, 0], shape [2, 6], file 'rank-1.shard'): lies outside the global "
               "shape [4, 6] in dimension 0");
  auto negative = with_piece(0, [](checkpoint_piece& p) { p.offset = {-1, 0}; });
  expect_error(open_forged(negative), errc::malformed_message, "every offset and extent must be in [0, 2^40]");
  auto wrong_rank = with_piece(0, [](checkpoint_piece& p) { p.shape = {2, 6, 1}; });
  expect_error(open_forged(wrong_rank), errc::malformed_message, "rank is 3 but the tensor's is 2");
}

TEST_F(UntrustedCheckpoint, OverlappingPiecesAreAnError) {
  auto forged = with_piece(1, [](checkpoint_piece& p) { p.offset = {1, 0}; });
  expect_error(open_forged(forged), errc::malformed_message,
               "tensor 'w' piece 0 (offset [0, 0], shape [2, 6], file 'rank-0.shard') overlaps piece 1 in the box "
               "at [1, 0] of shape [1, 6]");
}

TEST_F(UntrustedCheckpoint, MissingPiecesAreAnErrorNamingTheTensorAndTheGap) {
  auto forged = manifest_;
  forged.tensors[0].pieces.erase(forged.tensors[0].pieces.begin());
  expect_error(open_forged(forged), errc::malformed_message,
               "tensor 'w' (global shape [4, 6]): the pieces cover 12 of its 24 elements; the element at [0, 0] "
               "is in no piece");
  // A gap in the middle of the second dimension.
  auto narrow = with_piece(1, [](checkpoint_piece& p) {
    p.shape = {2, 4};
    p.byte_count = 32;
  });
  expect_error(open_forged(narrow), errc::malformed_message, "the element at [2, 4] is in no piece");
}

TEST_F(UntrustedCheckpoint, AWrongChecksumNamesTheFileAndTheTensor) {
  auto forged = with_piece(1, [](checkpoint_piece& p) { p.crc32c ^= 1; });
  auto reader = open_forged(forged);
  ASSERT_TRUE(reader) << reader.error().to_string();
  expect_error(reader->read("w"), errc::checksum_mismatch, "tensor 'w' piece 1 (offset [2, 0], shape [2, 6]) in file 'rank-1.shard'");
  expect_error(reader->verify(), errc::checksum_mismatch, "rank-1.shard");
  // Rows 0-1 come from the intact piece alone.
  EXPECT_TRUE(reader->read("w", {{0, 0}, {2, 6}}));
}

TEST_F(UntrustedCheckpoint, CorruptedShardBytesAreCaught) {
  const auto& piece = manifest_.tensors[0].pieces[0];
  auto shard = read_bytes(dir_ / piece.file);
  shard[piece.byte_offset + 5] ^= std::byte{0x01};
  write_bytes(dir_ / piece.file, shard);
  auto reader = checkpoint_reader::open(dir_);
  ASSERT_TRUE(reader);
  expect_error(reader->read("w"), errc::checksum_mismatch, "tensor 'w' piece 0 (offset [0, 0], shape [2, 6]) in file 'rank-0.shard'");
}

TEST_F(UntrustedCheckpoint, ATruncatedOrMissingShardIsAnError) {
  const auto& piece = manifest_.tensors[0].pieces[1];
  fs::resize_file(dir_ / piece.file, piece.byte_offset + 10);
  auto reader = checkpoint_reader::open(dir_);
  ASSERT_TRUE(reader);
  expect_error(reader->read("w"), errc::malformed_message, "run past the file's end");
  fs::remove(dir_ / piece.file);
  expect_error(reader->read("w"), errc::io_error, "rank-1.shard");
}

TEST_F(UntrustedCheckpoint, FileNamesThatLeaveTheDirectoryAreRefused) {
  for (const char* bad : {"../x", "/etc/passwd", "a/../../b", "..", ".", "", "manifest"}) {
    auto forged = with_piece(0, [&](checkpoint_piece& p) { p.file = bad; });
    expect_error(open_forged(forged), errc::malformed_message,
                 fmt::format("file name '{}' is not a plain name inside the checkpoint's directory", bad));
  }
}

TEST_F(UntrustedCheckpoint, AbsurdSizesAreRefusedBeforeAllocating) {
  auto huge_shape = manifest_;
  huge_shape.tensors[0].global_shape = {std::int64_t{1} << 50, 6};
  expect_error(open_forged(huge_shape), errc::malformed_message, "has a dimension outside [0, 2^40]");
  // A tensor of 2^80 elements whose first piece claims nearly all of them.
  auto huge_piece = with_piece(0, [](checkpoint_piece& p) {
    p.shape = {(std::int64_t{1} << 40) - 2, std::int64_t{1} << 40};
    p.byte_count = std::uint64_t{1} << 62;
  });
  huge_piece.tensors[0].global_shape = {std::int64_t{1} << 40, std::int64_t{1} << 40};
  expect_error(open_forged(huge_piece), errc::size_limit_exceeded, "is more than the limit of");
  auto far_offset = with_piece(0, [](checkpoint_piece& p) { p.byte_offset = std::uint64_t{1} << 63; });
  expect_error(open_forged(far_offset), errc::malformed_message, "byte offset 9223372036854775808 is above 2^62");
  auto deep = manifest_;
  deep.tensors[0].global_shape.assign(40, 1);
  expect_error(open_forged(deep), errc::size_limit_exceeded, "tensor 'w': the global shape has 40 dimensions");
  manifest_options small;
  small.max_piece_bytes = 32;
  expect_error(open_forged(manifest_, small), errc::size_limit_exceeded, "is more than the limit of 32 bytes");
  small = {};
  small.max_pieces = 1;
  expect_error(open_forged(manifest_, small), errc::size_limit_exceeded, "tensor 'w' has 2 pieces, above the limit 1");
}

TEST_F(UntrustedCheckpoint, DtypeMismatchesAreErrors) {
  auto unknown = manifest_;
  unknown.tensors[0].type = static_cast<dtype>(77);
  expect_error(open_forged(unknown), errc::unsupported_dtype, "tensor 'w': dtype 77 is not one troupe knows");
  auto wider = manifest_;
  wider.tensors[0].type = dtype::float64;
  expect_error(open_forged(wider), errc::malformed_message, "byte count is 48 but [2, 6] of float64 takes 96");
  auto reader = open_forged(manifest_);
  ASSERT_TRUE(reader);
  auto destination = tensor::zeros({2, 6}, dtype::float64);
  expect_error(reader->read_into("w", {0, 0}, destination), errc::state_mismatch,
               "tensor 'w' is float32 in the checkpoint but the destination is float64");
}

TEST_F(UntrustedCheckpoint, NamesMustBeUniqueAndPresent) {
  auto twice = manifest_;
  twice.tensors.push_back(twice.tensors[0]);
  expect_error(open_forged(twice), errc::malformed_message, "tensor 'w' appears twice");
  auto nameless = manifest_;
  nameless.tensors[0].name.clear();
  expect_error(open_forged(nameless), errc::malformed_message, "empty name");
}

TEST_F(UntrustedCheckpoint, RequestsOutsideTheCheckpointAreErrors) {
  auto reader = checkpoint_reader::open(dir_);
  ASSERT_TRUE(reader);
  expect_error(reader->read("v"), errc::state_mismatch, "has no tensor 'v'");
  expect_error(reader->read("w", {{3, 0}, {2, 6}}), errc::invalid_argument,
               "tensor 'w' of shape [4, 6]: the region at [3, 0] of shape [2, 6] is not inside it");
  expect_error(reader->read("w", {{0}, {4}}), errc::invalid_argument, "is not inside it");
}
