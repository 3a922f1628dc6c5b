// The two-phase save: a checkpoint exists only once its manifest is written
// and its directory renamed; crashes before that leave nothing
// latest_checkpoint() returns; keep_last prunes; commit refuses pieces that
// do not tile their tensors.
#include <csignal>
#include <cstdlib>
#include <fstream>

#include "sharded_checkpoint_support.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"

using namespace troupe;
using namespace troupe::testing;
namespace fs = std::filesystem;

namespace {

/// Two writers each holding half of "w" ([4, 6], split along dim 0), as of `step`.
std::vector<shard_writer> halves(const fs::path& root, std::uint64_t step) {
  std::vector<shard_writer> writers{{root, step, "rank-0"}, {root, step, "rank-1"}};
  auto pieces = split("w", patterned({4, 6}, dtype::float32), 0, 2);
  writers[0].add(pieces[0]);
  writers[1].add(pieces[1]);
  return writers;
}

expected<fs::path> save(const fs::path& root, std::uint64_t step, std::size_t keep_last = 0) {
  return commit_checkpoint(root, write_all(halves(root, step)), at_step(step, keep_last));
}

using CheckpointCommit = CheckpointDirectory;

} // namespace

TEST_F(CheckpointCommit, LatestOfAMissingRootIsNone) {
  auto latest = latest_checkpoint(root_ / "never-written");
  ASSERT_TRUE(latest);
  EXPECT_FALSE(latest->has_value());
}

TEST_F(CheckpointCommit, CommitRenamesTheStagingDirectory) {
  auto committed = save(root_, 5);
  ASSERT_TRUE(committed) << committed.error().to_string();
  EXPECT_EQ(*committed, checkpoint_path(root_, 5));
  EXPECT_TRUE(fs::exists(*committed / "manifest"));
  EXPECT_TRUE(fs::exists(*committed / "rank-0.shard"));
  EXPECT_FALSE(fs::exists(staging_path(root_, 5)));
  auto latest = latest_checkpoint(root_);
  ASSERT_TRUE(latest && latest->has_value());
  EXPECT_EQ(**latest, checkpoint_path(root_, 5));
}

TEST_F(CheckpointCommit, ACrashBeforeTheCommitLeavesNoCheckpoint) {
  ASSERT_TRUE(save(root_, 1));
  // Step 2: both shards written and fsynced, then the coordinator dies
  // before writing the manifest.
  write_all(halves(root_, 2));
  ASSERT_TRUE(fs::exists(staging_path(root_, 2) / "rank-1.shard"));
  auto latest = latest_checkpoint(root_);
  ASSERT_TRUE(latest && latest->has_value());
  EXPECT_EQ(**latest, checkpoint_path(root_, 1));
  // The next commit removes the abandoned staging directory.
  ASSERT_TRUE(save(root_, 3));
  EXPECT_FALSE(fs::exists(staging_path(root_, 2)));
  EXPECT_TRUE(fs::exists(checkpoint_path(root_, 1)));
}

TEST_F(CheckpointCommit, ADirectoryWithoutAValidManifestIsNotACheckpoint) {
  ASSERT_TRUE(save(root_, 1));
  fs::create_directories(checkpoint_path(root_, 8)); // no manifest
  fs::create_directories(checkpoint_path(root_, 9));
  std::ofstream(checkpoint_path(root_, 9) / "manifest") << "half a manifest";
  auto latest = latest_checkpoint(root_);
  ASSERT_TRUE(latest && latest->has_value());
  EXPECT_EQ(**latest, checkpoint_path(root_, 1));
}

TEST_F(CheckpointCommit, KeepLastPrunesOlderCheckpoints) {
  for (std::uint64_t step = 1; step <= 5; ++step)
    ASSERT_TRUE(save(root_, step * 10, 2));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(root_))
    left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step-40", "step-50"}));
}

// A job stopped while pruning (troupe-launch stops every rank when one dies)
// leaves no "step-N" without a manifest: the pruned checkpoint loses its name
// before its files, and the next commit clears what is left of it.
TEST_F(CheckpointCommit, APruneCutShortLeavesOnlyCompleteCheckpoints) {
  ASSERT_TRUE(save(root_, 1, 1));
  auto pruning = [&] {
    ::setenv("TROUPE_CHECKPOINT_TEST_KILL_WHILE_PRUNING", "1", 1);
    std::exit(save(root_, 2, 1) ? 0 : 1);
  };
  EXPECT_EXIT(pruning(), ::testing::KilledBySignal(SIGKILL), "");
  for (const auto& entry : fs::directory_iterator(root_)) {
    auto name = entry.path().filename().string();
    if (!name.ends_with(".tmp")) {
      EXPECT_TRUE(read_manifest(entry.path() / "manifest")) << name << " is left without a manifest";
    }
  }
  EXPECT_FALSE(fs::exists(checkpoint_path(root_, 1)));
  auto latest = latest_checkpoint(root_);
  ASSERT_TRUE(latest && latest->has_value());
  EXPECT_EQ(**latest, checkpoint_path(root_, 2));
  ASSERT_TRUE(save(root_, 3, 1));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(root_))
    left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, (std::vector<std::string>{"step-3"}));
}

TEST_F(CheckpointCommit, StrayFilesInTheStagingDirectoryAreRemoved) {
  auto writers = halves(root_, 4);
  auto written = write_all(writers);
  std::ofstream(staging_path(root_, 4) / "rank-7.shard") << "an earlier attempt's shard";
  ASSERT_TRUE(commit_checkpoint(root_, written, at_step(4)));
  EXPECT_FALSE(fs::exists(checkpoint_path(root_, 4) / "rank-7.shard"));
}

TEST_F(CheckpointCommit, DiscardStagingRemovesEveryUncommittedSaveAndKeepsTheCheckpoints) {
  ASSERT_TRUE(save(root_, 1));
  write_all(halves(root_, 2)); // a dead run's save of step 2, reported but never committed
  write_all(halves(root_, 3));
  std::ofstream(root_ / "step-x.tmp") << "not a staging directory";
  ASSERT_TRUE(discard_staging(root_));
  EXPECT_FALSE(fs::exists(staging_path(root_, 2)));
  EXPECT_FALSE(fs::exists(staging_path(root_, 3)));
  EXPECT_TRUE(fs::exists(root_ / "step-x.tmp"));
  auto latest = latest_checkpoint(root_);
  ASSERT_TRUE(latest && *latest);
  EXPECT_EQ(**latest, checkpoint_path(root_, 1));
  EXPECT_TRUE(discard_staging(root_ / "never-written"));
  // The restarted run's save of step 2 sees none of the dead run's reports.
  auto first = shard_writer(root_, 2, "rank-0").write();
  ASSERT_TRUE(first);
  std::vector<std::string> both{"rank-0", "rank-1"};
  auto reports = collect_reports(root_, 2, both, std::chrono::milliseconds(50));
  ASSERT_FALSE(reports);
  EXPECT_NE(reports.error().message().find("no report from rank-1"), std::string::npos) << reports.error().message();
}

TEST_F(CheckpointCommit, MissingPiecesAreRefusedNamingTheTensorAndElement) {
  auto writers = halves(root_, 6);
  auto written = writers[0].write(); // rank-1 never reports
  ASSERT_TRUE(written);
  auto committed = commit_checkpoint(root_, *written, at_step(6));
  ASSERT_FALSE(committed);
  EXPECT_EQ(committed.error().code(), errc::malformed_message);
  EXPECT_NE(committed.error().message().find("tensor 'w' (global shape [4, 6]): the pieces cover 12 of its 24 "
                                             "elements; the element at [2, 0] is in no piece"),
            std::string::npos)
      << committed.error().message();
  EXPECT_FALSE(fs::exists(checkpoint_path(root_, 6)));
}

TEST_F(CheckpointCommit, WritersThatDisagreeOnATensorAreRefused) {
  std::vector<shard_writer> writers{{root_, 1, "rank-0"}, {root_, 1, "rank-1"}};
  writers[0].add(split_piece("w", patterned({2, 6}, dtype::float32), {4, 6}, 0, 0));
  writers[1].add(split_piece("w", patterned({2, 6}, dtype::float64), {4, 6}, 0, 2));
  auto committed = commit_checkpoint(root_, write_all(writers), at_step(1));
  ASSERT_FALSE(committed);
  EXPECT_EQ(committed.error().code(), errc::state_mismatch);
  EXPECT_NE(committed.error().message().find("tensor 'w' is float32 [4, 6] in file 'rank-0.shard' but float64"),
            std::string::npos)
      << committed.error().message();
}

TEST_F(CheckpointCommit, AStepIsCommittedOnce) {
  ASSERT_TRUE(save(root_, 1));
  auto again = save(root_, 1);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message().find("already exists"), std::string::npos) << again.error().message();
  EXPECT_TRUE(checkpoint_reader::open(checkpoint_path(root_, 1)));
}

TEST_F(CheckpointCommit, CollectedReportsCommitAndAFailedWriterIsNamedWithItsMessage) {
  auto writers = halves(root_, 7);
  ASSERT_TRUE(writers[0].write());
  ASSERT_TRUE(writers[1].write());
  const std::vector<std::string> names{"rank-0", "rank-1"};
  auto written = collect_reports(root_, 7, names, std::chrono::seconds(5));
  ASSERT_TRUE(written) << written.error().message();
  ASSERT_TRUE(commit_checkpoint(root_, *written, at_step(7, 0)));

  auto later = halves(root_, 8);
  ASSERT_TRUE(later[0].write());
  later[1].report_failure(error(errc::io_error, "disk full"));
  auto failed = collect_reports(root_, 8, names, std::chrono::seconds(5));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message(), "checkpoint of step 8: writer 'rank-1' failed: disk full");
}

TEST_F(CheckpointCommit, AForgedReportIsRefusedNamingItsFile) {
  auto writers = halves(root_, 9);
  auto written = writers[0].write();
  ASSERT_TRUE(written);
  ASSERT_TRUE(writers[1].write());
  const std::vector<std::string> names{"rank-0", "rank-1"};
  auto forge = [&](checkpoint_manifest report) {
    auto image = encode_manifest(report);
    std::ofstream(staging_path(root_, 9) / "rank-1.pieces", std::ios::binary)
      .write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  };
  forge({9, *written, {}}); // rank-1 claiming rank-0's shard
  auto claimed = collect_reports(root_, 9, names, std::chrono::seconds(5));
  ASSERT_FALSE(claimed);
  EXPECT_NE(claimed.error().message().find("rank-1.pieces' names file 'rank-0.shard'"), std::string::npos) << claimed.error().message();
  forge({8, {}, {}}); // another step's
  auto stale = collect_reports(root_, 9, names, std::chrono::seconds(5));
  ASSERT_FALSE(stale);
  EXPECT_NE(stale.error().message().find("rank-1.pieces' reports step 8, not 9"), std::string::npos) << stale.error().message();
  std::ofstream(staging_path(root_, 9) / "rank-1.pieces") << "garbage";
  auto garbled = collect_reports(root_, 9, names, std::chrono::seconds(5));
  ASSERT_FALSE(garbled);
  EXPECT_NE(garbled.error().message().find("rank-1.pieces"), std::string::npos) << garbled.error().message();
}

TEST(ShardWriter, RejectsWriterNamesThatLeaveTheDirectory) {
  for (const char* bad : {"../x", "a/b", ".hidden", "", "manifest"})
    EXPECT_THROW(shard_writer("/tmp", 1, bad), usage_error) << bad;
}

TEST(ShardWriter, RejectsAPieceOutsideItsGlobalShape) {
  shard_writer writer("/tmp", 1, "rank-0");
  EXPECT_THROW(writer.add(split_piece("w", tensor::zeros({3, 6}), {4, 6}, 0, 2)), usage_error);
  EXPECT_THROW(writer.add(split_piece("w", tensor::zeros({2, 6}), {4, 6}, 0, 0), std::vector<std::string>{"rank-1", "rank-2"}), usage_error);
}
