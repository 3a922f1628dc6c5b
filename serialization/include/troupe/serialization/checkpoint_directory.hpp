#pragma once
// The directory of a job's checkpoints and the second phase of a save.
//
//   <root>/step-<N>.tmp/   being written: shard files, then the manifest
//   <root>/step-<N>/       a complete checkpoint (renamed from .tmp)
//
// A save goes: (1) every writer writes its shard file into step-<N>.tmp/
// and fsyncs it (shard_writer.hpp); (2) the coordinator collects what they
// wrote and calls commit_checkpoint(), which checks that the pieces tile
// every tensor, writes the manifest last (fsynced), renames the directory to
// step-<N> and fsyncs <root>. A crash at any point before the rename leaves
// only a .tmp directory, which is not a checkpoint: latest_checkpoint()
// never returns it and the next commit of a later step removes it. A run
// restarted after such a crash saves the same steps again, so before its
// first save it removes every .tmp directory (discard_staging()): a report
// the dead run left in step-<N>.tmp would otherwise pass for this run's,
// and the coordinator would commit the dead run's shard and rename the
// directory while this run's writer still writes into it.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "troupe/serialization/checkpoint_manifest.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {

/// `<root>/step-<N>`: where step N's checkpoint lives once committed.
std::filesystem::path checkpoint_path(const std::filesystem::path& root, std::uint64_t step);
/// `<root>/step-<N>.tmp`: where its shard files are written before.
std::filesystem::path staging_path(const std::filesystem::path& root, std::uint64_t step);

struct commit_options {
  std::uint64_t step = 0;
  /// The driver's state: data position, random state, ... (opaque bytes).
  checkpoint_metadata metadata;
  /// How many complete checkpoints to keep, newest first; 0 keeps all.
  std::size_t keep_last = 0;
};

/// The coordinator's commit: `written` is every writer's shard_writer::write()
/// result, concatenated. Checks that the pieces of each tensor agree on its
/// dtype and global shape and tile it exactly and that their files are in the
/// staging directory; removes stray files there; writes the manifest; renames
/// the directory; prunes older checkpoints beyond `keep_last` and abandoned
/// staging directories of earlier steps. Returns the checkpoint's directory.
expected<std::filesystem::path> commit_checkpoint(const std::filesystem::path& root,
                                                  std::span<const checkpoint_tensor> written,
                                                  const commit_options& options);

/// The coordinator's wait for the writers of step `step` in another process:
/// polls the staging directory until each of `writers` has reported
/// (shard_writer::write's report, or report_failure's), at most `timeout`;
/// returns their pieces, concatenated, for commit_checkpoint(). A report is
/// outside input: it must parse, be for `step` and name only its writer's
/// shard file. Errors: a writer's failure (errc::io_error naming the writer
/// and its message), a bad report (naming its file), errc::io_error naming
/// the writers that did not report in time.
/// `abandon`, when given, is asked while waiting: a reason ends the wait at
/// once with an error naming it (a writer's process was lost: its report
/// will never come).
expected<std::vector<checkpoint_tensor>> collect_reports(
  const std::filesystem::path& root, std::uint64_t step, std::span<const std::string> writers,
  std::chrono::milliseconds timeout, const std::function<std::optional<std::string>()>& abandon = {});

/// Removes every staging directory (`step-<N>.tmp`) under `root`: saves
/// that never committed, of a run that is over. Call it only while no writer
/// writes (a restarted run's coordinator, before its first save: every other
/// writer of the run saves after it, see checkpoints::resume()). Nothing to
/// do when `root` does not exist. Errors: `root` unreadable, a directory that
/// cannot be removed (naming it).
expected<void> discard_staging(const std::filesystem::path& root);

/// The newest committed checkpoint under `root` (the highest N of a
/// `step-<N>` directory whose manifest parses), or nullopt when there is
/// none or `root` does not exist. Errors: `root` unreadable.
expected<std::optional<std::filesystem::path>> latest_checkpoint(const std::filesystem::path& root);

} // namespace troupe
