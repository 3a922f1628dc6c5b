// Distributed checkpoints saved at one layout and read at another
// (resharding), bitwise equal to the originals; replicated state written
// once, spread over its holders; a consolidated file loads into a
// one-process module.
#include <map>
#include <set>

#include "sharded_checkpoint_support.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"

using namespace troupe;
using namespace troupe::testing;

namespace {

const std::vector<std::string> ranks{"rank-0", "rank-1", "rank-2"};

/// The whole tensors of a small model state.
std::map<std::string, tensor> originals() {
  return {{"fc1.weight", patterned({6, 5}, dtype::float32)},
          {"fc2.weight", patterned({4, 9}, dtype::float64)},
          {"optimizer.steps", patterned({8, 3}, dtype::int64)},
          {"norm.weight", patterned({5}, dtype::float64)}};
}

/// Saves `originals()` as step `step`: fc1.weight split 2 ways along dim 0
/// (ranks 0-1), fc2.weight 3 ways along dim 1 and optimizer.steps 3 ways
/// (unevenly: 3, 3, 2) along dim 0 (ranks 0-2), and norm.weight held whole
/// by all three. Returns every writer's report.
std::vector<checkpoint_tensor> save_sample(const std::filesystem::path& root, std::uint64_t step) {
  auto whole = originals();
  std::vector<shard_writer> writers;
  for (const auto& rank : ranks)
    writers.emplace_back(root, step, rank);
  auto fc1 = split("fc1.weight", whole["fc1.weight"], 0, 2);
  auto fc2 = split("fc2.weight", whole["fc2.weight"], 1, 3);
  auto steps = split("optimizer.steps", whole["optimizer.steps"], 0, 3);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (r < fc1.size())
      writers[r].add(fc1[r]);
    writers[r].add(fc2[r]);
    writers[r].add(steps[r]);
    writers[r].add(split_piece("norm.weight", whole["norm.weight"], {5}, -1, 0), ranks);
  }
  return write_all(writers);
}

class ShardedCheckpoint : public CheckpointDirectory {
protected:
  /// Saves the sample as step 7 and opens it.
  checkpoint_reader saved() {
    auto committed = commit_checkpoint(root_, save_sample(root_, 7), {.step = 7, .metadata = {{"data_position", "1234"}}});
    EXPECT_TRUE(committed) << committed.error().to_string();
    auto reader = checkpoint_reader::open(checkpoint_path(root_, 7));
    EXPECT_TRUE(reader) << reader.error().to_string();
    return std::move(*reader);
  }
};

} // namespace

TEST_F(ShardedCheckpoint, LoadsEveryTensorWholeBitwiseEqual) {
  auto reader = saved();
  EXPECT_EQ(reader.step(), 7u);
  ASSERT_EQ(reader.manifest().tensors.size(), 4u);
  for (const auto& [name, whole] : originals()) {
    auto loaded = reader.read(name);
    ASSERT_TRUE(loaded) << loaded.error().to_string();
    EXPECT_TRUE(bitwise_equal(*loaded, whole)) << name;
  }
  EXPECT_EQ(reader.find("fc1.weight")->pieces.size(), 2u);
  EXPECT_EQ(reader.find("fc2.weight")->pieces.size(), 3u);
  EXPECT_EQ(reader.find("optimizer.steps")->pieces[2].shape, (dims{2, 3}));
  EXPECT_TRUE(reader.verify());
}

TEST_F(ShardedCheckpoint, ReplicatedStateIsWrittenExactlyOnce) {
  auto written = save_sample(root_, 1);
  int copies = 0;
  for (const auto& t : written)
    copies += t.name == "norm.weight" ? static_cast<int>(t.pieces.size()) : 0;
  EXPECT_EQ(copies, 1);
  ASSERT_TRUE(commit_checkpoint(root_, written, at_step(1)));
  auto reader = checkpoint_reader::open(checkpoint_path(root_, 1));
  ASSERT_TRUE(reader);
  EXPECT_EQ(reader->find("norm.weight")->pieces.size(), 1u);
}

TEST_F(ShardedCheckpoint, ReplicatedStateIsSpreadOverItsHolders) {
  std::vector<shard_writer> writers;
  for (const auto& rank : ranks)
    writers.emplace_back(root_, 1, rank);
  for (int i = 0; i < 30; ++i)
    for (auto& writer : writers)
      writer.add(split_piece("layer" + std::to_string(i) + ".bias", patterned({4}, dtype::float32), {4}, -1, 0), ranks);
  std::map<std::string, int> pieces_by_file;
  for (const auto& t : write_all(writers))
    for (const auto& piece : t.pieces)
      ++pieces_by_file[piece.file];
  ASSERT_EQ(pieces_by_file.size(), 3u) << "every holder writes a share";
  int total = 0;
  for (const auto& [file, count] : pieces_by_file) {
    EXPECT_GE(count, 4) << file;
    total += count;
  }
  EXPECT_EQ(total, 30);
}

TEST_F(ShardedCheckpoint, ReshardsToAnotherDimensionAndDegree) {
  auto reader = saved();
  auto whole = originals();
  // fc1.weight was split 2 ways along dim 0: load 3 ways along dim 0 and
  // 2 ways along dim 1. fc2.weight was split 3 ways along dim 1: load 2 ways
  // along dim 1 and 2 ways along dim 0. optimizer.steps: 2 ways along dim 0.
  struct layout {
    std::string name;
    std::int64_t dim, ways;
  };
  for (const auto& [name, dim, ways] : std::vector<layout>{{"fc1.weight", 0, 3},
                                                           {"fc1.weight", 1, 2},
                                                           {"fc2.weight", 1, 2},
                                                           {"fc2.weight", 0, 2},
                                                           {"optimizer.steps", 0, 2},
                                                           {"norm.weight", 0, 2}}) {
    for (const auto& expected : split(name, whole[name], dim, ways)) {
      auto loaded = reader.read(name, {expected.offset, expected.value.shape()});
      ASSERT_TRUE(loaded) << loaded.error().to_string();
      EXPECT_TRUE(bitwise_equal(*loaded, expected.value)) << name << " dim " << dim << " at " << expected.offset[dim];
    }
  }
}

TEST_F(ShardedCheckpoint, ReadsAnArbitraryRegionAcrossPieces) {
  auto reader = saved();
  auto whole = originals();
  // Rows 1-2, columns 2-7 of fc2.weight: parts of all three saved pieces.
  auto region = reader.read("fc2.weight", {{1, 2}, {2, 6}});
  ASSERT_TRUE(region) << region.error().to_string();
  EXPECT_TRUE(bitwise_equal(*region, whole["fc2.weight"].narrow(0, 1, 2).narrow(1, 2, 6)));
  // Rows 2-6 of optimizer.steps cross its 3-row pieces; an empty region.
  auto rows = reader.read("optimizer.steps", {{2, 1}, {5, 2}});
  ASSERT_TRUE(rows) << rows.error().to_string();
  EXPECT_TRUE(bitwise_equal(*rows, whole["optimizer.steps"].narrow(0, 2, 5).narrow(1, 1, 2)));
  auto empty = reader.read("fc1.weight", {{6, 0}, {0, 5}});
  ASSERT_TRUE(empty) << empty.error().to_string();
  EXPECT_EQ(empty->numel(), 0);
}

TEST_F(ShardedCheckpoint, ALocalTensorHoldingSeveralPiecesReshards) {
  // Attention's fused c_attn weight [12, 4]: q, k and v rows of 2 heads of
  // 2 rows each. Rank r of 2 holds its head's q, k and v rows in one local
  // [6, 4] tensor: three pieces of the whole, at global rows 2r, 4 + 2r and
  // 8 + 2r (parallel::parameter_shard's offset, size and local_offset).
  auto whole = patterned({12, 4}, dtype::float32);
  std::vector<shard_writer> writers{{root_, 1, "tp-0"}, {root_, 1, "tp-1"}};
  for (std::int64_t r = 0; r < 2; ++r) {
    auto local = tensor::empty({6, 4}, dtype::float32);
    for (std::int64_t part = 0; part < 3; ++part) {
      local.narrow(0, 2 * part, 2).copy_from(whole.narrow(0, 4 * part + 2 * r, 2));
      writers[static_cast<std::size_t>(r)].add(
          split_piece("attn.c_attn.weight", local.narrow(0, 2 * part, 2), {12, 4}, 0, 4 * part + 2 * r));
    }
  }
  ASSERT_TRUE(commit_checkpoint(root_, write_all(writers), at_step(1)));
  auto reader = checkpoint_reader::open(checkpoint_path(root_, 1));
  ASSERT_TRUE(reader);
  EXPECT_EQ(reader->find("attn.c_attn.weight")->pieces.size(), 6u);
  auto loaded = reader->read("attn.c_attn.weight");
  ASSERT_TRUE(loaded) << loaded.error().to_string();
  EXPECT_TRUE(bitwise_equal(*loaded, whole));
  for (const auto& expected : split("attn.c_attn.weight", whole, 0, 3)) { // 3 ranks of 4 rows each
    auto rows = reader->read("attn.c_attn.weight", {expected.offset, expected.value.shape()});
    ASSERT_TRUE(rows) << rows.error().to_string();
    EXPECT_TRUE(bitwise_equal(*rows, expected.value));
  }
}

TEST_F(ShardedCheckpoint, ReadsIntoAParameterShard) {
  auto reader = saved();
  auto shard = tensor::zeros({3, 5}, dtype::float32);
  ASSERT_TRUE(reader.read_into("fc1.weight", {3, 0}, shard));
  EXPECT_TRUE(bitwise_equal(shard, originals()["fc1.weight"].narrow(0, 3, 3)));
}

TEST_F(ShardedCheckpoint, KeepsTheDriverStateAsOpaqueBytes) {
  std::string random_state("\x00\x01\xff\xfe philox", 12);
  auto committed = commit_checkpoint(root_, save_sample(root_, 3),
                                     {.step = 3, .metadata = {{"data_position", "batch 96"}, {"random_state", random_state}}});
  ASSERT_TRUE(committed) << committed.error().to_string();
  auto reader = checkpoint_reader::open(*committed);
  ASSERT_TRUE(reader);
  EXPECT_EQ(reader->manifest().metadata,
            (checkpoint_metadata{{"data_position", "batch 96"}, {"random_state", random_state}}));
}

TEST_F(ShardedCheckpoint, ConsolidatedFileLoadsIntoAOneProcessModule) {
  // A linear layer saved as two column-parallel ranks would hold it (weight
  // rows split, bias split with them), then loaded into one process.
  nn::linear saved_layer(5, 6, /*seed=*/1);
  auto state = saved_layer.state_dict();
  std::vector<shard_writer> writers{{root_, 2, "tp-0"}, {root_, 2, "tp-1"}};
  for (const auto& [name, value] : state) {
    auto pieces = split(name, value, 0, 2);
    writers[0].add(pieces[0]);
    writers[1].add(pieces[1]);
  }
  auto committed = commit_checkpoint(root_, write_all(writers), at_step(2));
  ASSERT_TRUE(committed) << committed.error().to_string();
  auto reader = checkpoint_reader::open(*committed);
  ASSERT_TRUE(reader);
  auto all = reader->read_all();
  ASSERT_TRUE(all) << all.error().to_string();
  auto file = root_ / "consolidated.ckpt";
  ASSERT_TRUE(save_checkpoint(file, *all));

  nn::linear loaded_layer(5, 6, /*seed=*/2);
  auto loaded = load_checkpoint(file);
  ASSERT_TRUE(loaded) << loaded.error().to_string();
  auto applied = loaded_layer.load_state_dict(*loaded);
  ASSERT_TRUE(applied) << applied.error().to_string();
  for (const auto& [name, value] : loaded_layer.state_dict())
    EXPECT_TRUE(bitwise_equal(value, find_tensor(state, name))) << name;
}
