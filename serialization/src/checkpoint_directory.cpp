#include "troupe/serialization/checkpoint_directory.hpp"

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <set>
#include <string_view>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint_layout.hpp"
#include "durable_file.hpp"

namespace troupe {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view staging_suffix = ".tmp";

/// N of a directory name "step-<N>" (or "step-<N>.tmp" when `staging`).
std::optional<std::uint64_t> step_of(std::string_view name, bool staging) {
  if (!name.starts_with("step-"))
    return std::nullopt;
  name.remove_prefix(5);
  if (staging) {
    if (!name.ends_with(staging_suffix))
      return std::nullopt;
    name.remove_suffix(staging_suffix.size());
  }
  std::uint64_t step = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (ec != std::errc{} || end != name.data() + name.size() || name.empty())
    return std::nullopt;
  return step;
}

error fs_error(std::string_view what, const fs::path& path, const std::error_code& failure) {
  return make_error(errc::io_error, "{} '{}': {}", what, path.string(), failure.message());
}

/// Merges the writers' reports: one entry per tensor (sorted by name), its
/// pieces sorted by offset, so the manifest does not depend on the order in
/// which writers reported.
expected<std::vector<checkpoint_tensor>> merge(std::span<const checkpoint_tensor> written) {
  std::map<std::string, checkpoint_tensor> merged;
  for (const auto& t : written) {
    auto [it, fresh] = merged.try_emplace(t.name, checkpoint_tensor{t.name, t.type, t.global_shape, {}});
    auto& into = it->second;
    if (!fresh && (into.type != t.type || into.global_shape != t.global_shape))
      return make_error(errc::state_mismatch,
                        "commit_checkpoint: tensor '{}' is {} {} in file '{}' but {} {} in file '{}'", t.name,
                        into.type, into.global_shape, into.pieces.empty() ? "?" : into.pieces.front().file, t.type,
                        t.global_shape, t.pieces.empty() ? "?" : t.pieces.front().file);
    into.pieces.insert(into.pieces.end(), t.pieces.begin(), t.pieces.end());
  }
  std::vector<checkpoint_tensor> out;
  for (auto& [name, t] : merged) {
    std::sort(t.pieces.begin(), t.pieces.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    out.push_back(std::move(t));
  }
  return out;
}

/// Every shard file the manifest names is in `staging` and long enough;
/// anything else there (an earlier attempt's files) is removed.
expected<void> check_and_tidy(const fs::path& staging, const checkpoint_manifest& manifest) {
  std::map<std::string, std::uint64_t> ends;
  for (const auto& t : manifest.tensors)
    for (const auto& piece : t.pieces) {
      auto& end = ends[piece.file];
      end = std::max(end, piece.byte_offset + piece.byte_count);
    }
  for (const auto& [file, end] : ends) {
    std::error_code failure;
    auto size = fs::file_size(staging / file, failure);
    if (failure)
      return fs_error("commit_checkpoint: shard file", staging / file, failure);
    if (size < end)
      return make_error(errc::io_error, "commit_checkpoint: shard file '{}' is {} bytes but a piece ends at {}",
                        (staging / file).string(), size, end);
  }
  std::error_code failure;
  for (const auto& entry : fs::directory_iterator(staging, failure))
    if (!ends.contains(entry.path().filename().string())) {
      fs::remove_all(entry.path(), failure);
      if (failure)
        return fs_error("commit_checkpoint: cannot remove stray", entry.path(), failure);
    }
  if (failure)
    return fs_error("commit_checkpoint: cannot list", staging, failure);
  return {};
}

/// The test hook TROUPE_CHECKPOINT_TEST_KILL_WHILE_PRUNING (set to
/// anything): the process kills itself with SIGKILL once the first pruned
/// checkpoint has lost its name but before its files are removed, as a job
/// stopped in the middle of pruning would be (checkpoint_directory_test.cpp).
void kill_if_testing_a_cut_short_prune() {
  if (std::getenv("TROUPE_CHECKPOINT_TEST_KILL_WHILE_PRUNING") != nullptr)
    ::raise(SIGKILL);
}

/// Removes committed checkpoints beyond the newest `keep_last` (never
/// `current`), and staging directories of steps before `current`: a save
/// that never committed. A pruned checkpoint is first renamed back to its
/// staging name, atomically, so a process stopped while removing its files
/// leaves a staging directory (which the next commit or discard_staging
/// removes), never a "step-N" without a manifest that looks like a damaged
/// checkpoint.
expected<void> prune(const fs::path& root, std::uint64_t current, std::size_t keep_last) {
  std::vector<std::uint64_t> committed;
  std::vector<fs::path> abandoned;
  std::error_code failure;
  for (const auto& entry : fs::directory_iterator(root, failure)) {
    auto name = entry.path().filename().string();
    if (auto step = step_of(name, false); step && fs::exists(entry.path() / detail::manifest_file_name))
      committed.push_back(*step);
    else if (auto staged = step_of(name, true); staged && *staged < current)
      abandoned.push_back(entry.path());
  }
  if (failure)
    return fs_error("commit_checkpoint: cannot list", root, failure);
  for (const auto& path : abandoned) {
    fs::remove_all(path, failure);
    if (failure)
      return fs_error("commit_checkpoint: committed, but cannot remove", path, failure);
  }
  std::sort(committed.rbegin(), committed.rend());
  for (std::size_t i = keep_last; keep_last > 0 && i < committed.size(); ++i) {
    if (committed[i] == current)
      continue;
    auto parked = staging_path(root, committed[i]);
    fs::rename(checkpoint_path(root, committed[i]), parked, failure);
    if (failure)
      return fs_error("commit_checkpoint: committed, but cannot unname", checkpoint_path(root, committed[i]),
                      failure);
    kill_if_testing_a_cut_short_prune();
    fs::remove_all(parked, failure);
    if (failure)
      return fs_error("commit_checkpoint: committed, but cannot remove", parked, failure);
  }
  return {};
}

} // namespace

fs::path checkpoint_path(const fs::path& root, std::uint64_t step) { return root / fmt::format("step-{}", step); }

fs::path staging_path(const fs::path& root, std::uint64_t step) {
  return root / fmt::format("step-{}{}", step, staging_suffix);
}

expected<fs::path> commit_checkpoint(const fs::path& root, std::span<const checkpoint_tensor> written,
                                     const commit_options& options) {
  auto tensors = merge(written);
  if (!tensors)
    return tensors.error();
  checkpoint_manifest manifest{options.step, std::move(*tensors), options.metadata};
  if (auto ok = detail::validate_manifest(manifest, {}); !ok)
    return make_error(ok.error().code(), "commit_checkpoint: {}", ok.error().message());

  auto staging = staging_path(root, options.step);
  auto final_path = checkpoint_path(root, options.step);
  std::error_code failure;
  fs::create_directories(staging, failure); // a checkpoint of no tensors has no shard files
  if (failure)
    return fs_error("commit_checkpoint: cannot create", staging, failure);
  if (fs::exists(final_path, failure))
    return make_error(errc::io_error, "commit_checkpoint: '{}' already exists", final_path.string());
  if (auto ok = check_and_tidy(staging, manifest); !ok)
    return ok.error();

  // The manifest last: before it is durable, the directory is no checkpoint.
  auto image = encode_manifest(manifest);
  auto written_manifest = detail::write_file_atomically(
      staging / detail::manifest_file_name, [&](detail::file_sink& out) { return out.write(image); });
  if (!written_manifest)
    return written_manifest.error();
  if (::rename(staging.c_str(), final_path.c_str()) != 0)
    return detail::os_error("commit_checkpoint: cannot rename the staging directory onto", final_path);
  if (auto ok = detail::fsync_directory(root); !ok)
    return ok.error();
  if (auto ok = prune(root, options.step, options.keep_last); !ok)
    return ok.error();
  return final_path;
}

expected<void> discard_staging(const fs::path& root) {
  std::error_code failure;
  if (!fs::exists(root, failure))
    return {};
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(root, failure))
    if (step_of(entry.path().filename().string(), true))
      doomed.push_back(entry.path());
  if (failure)
    return fs_error("discard_staging: cannot list", root, failure);
  for (const auto& path : doomed) {
    fs::remove_all(path, failure);
    if (failure)
      return fs_error("discard_staging: cannot remove", path, failure);
  }
  return {};
}

expected<std::vector<checkpoint_tensor>> collect_reports(
  const fs::path& root, std::uint64_t step, std::span<const std::string> writers, std::chrono::milliseconds timeout,
  const std::function<std::optional<std::string>()>& abandon) {
  auto staging = staging_path(root, step);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<checkpoint_tensor> out;
  std::set<std::string> waiting(writers.begin(), writers.end());
  manifest_options as_report;
  as_report.require_tiling = false;
  for (;;) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      const auto& writer = *it;
      std::error_code failure;
      if (auto failed = staging / (writer + detail::failure_suffix); fs::exists(failed, failure)) {
        std::string why;
        if (auto file = detail::read_only_file::open(failed)) {
          why.resize(std::min<std::uint64_t>(file->size(), 512));
          if (!file->read(reinterpret_cast<std::byte*>(why.data()), why.size(), 0))
            why = "(its report could not be read)";
        }
        return make_error(errc::io_error, "checkpoint of step {}: writer '{}' failed: {}", step, writer, why);
      }
      auto report_path = staging / (writer + detail::report_suffix);
      if (!fs::exists(report_path, failure)) {
        ++it;
        continue;
      }
      auto report = read_manifest(report_path, as_report);
      if (!report)
        return report.error();
      if (report->step != step)
        return make_error(errc::malformed_message, "'{}' reports step {}, not {}", report_path.string(),
                          report->step, step);
      for (auto& t : report->tensors) {
        for (const auto& piece : t.pieces)
          if (piece.file != writer + ".shard")
            return make_error(errc::malformed_message, "'{}' names file '{}' for '{}', not its own shard",
                              report_path.string(), piece.file, t.name);
        out.push_back(std::move(t));
      }
      it = waiting.erase(it);
    }
    if (waiting.empty())
      return out;
    if (auto reason = abandon ? abandon() : std::nullopt)
      return make_error(errc::io_error, "checkpoint of step {}: gave up waiting for {}: {}", step,
                        fmt::join(waiting, ", "), *reason);
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(errc::io_error, "checkpoint of step {}: no report from {} within {} ms", step,
                        fmt::join(waiting, ", "), timeout.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

expected<std::optional<fs::path>> latest_checkpoint(const fs::path& root) {
  std::error_code failure;
  if (!fs::exists(root, failure))
    return std::optional<fs::path>{};
  std::vector<std::uint64_t> steps;
  for (const auto& entry : fs::directory_iterator(root, failure))
    if (auto step = step_of(entry.path().filename().string(), false); step && entry.is_directory())
      steps.push_back(*step);
  if (failure)
    return fs_error("latest_checkpoint: cannot list", root, failure);
  std::sort(steps.rbegin(), steps.rend());
  for (auto step : steps)
    if (read_manifest(checkpoint_path(root, step) / detail::manifest_file_name))
      return std::optional<fs::path>{checkpoint_path(root, step)};
  return std::optional<fs::path>{};
}

} // namespace troupe
