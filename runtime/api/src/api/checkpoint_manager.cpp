// CheckpointManager: iteration directories, the tracker file and keep-last-N.
#include "distckpt/api/checkpoint_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "distckpt/format/checkpoint_config.h"
#include "format/commit.h"
#include "io/file.h"

namespace distckpt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIterPrefix = "iter_";

// "iter_0000100" -> 100; nullopt for any other name.
std::optional<int64_t> iteration_of(const std::string& name) {
  if (name.rfind(kIterPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::char_traits<char>::length(kIterPrefix));
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

}  // namespace

CheckpointManager::CheckpointManager(std::string root, size_t keep_last)
    : root_(std::move(root)), keep_last_(keep_last) {}

std::string CheckpointManager::path_for(int64_t iteration) const {
  if (iteration < 0) throw Error(fmt::format("CheckpointManager: iteration {} is negative", iteration));
  return fmt::format("{}/{}{:07d}", root_, kIterPrefix, iteration);
}

SaveReport CheckpointManager::save(const StateDict& sharded_state_dict, int64_t iteration, Communicator& comm,
                                   const SaveOptions& options) {
  const std::string dir = path_for(iteration);
  // The save's coordinator, which committed it, also updates the tracker.
  const bool coordinator = comm.rank() == options.coordinator_rank;
  run_agreed(comm, "create the checkpoint root", [&] {
    if (coordinator) io::make_dirs(root_);
  });
  const SaveReport report = distckpt::save(sharded_state_dict, dir, comm, options);
  run_agreed(comm, "update the latest-checkpoint tracker", [&] {
    if (coordinator) mark_committed(iteration);
  });
  return report;
}

void CheckpointManager::mark_committed(int64_t iteration) {
  const std::string dir = path_for(iteration);
  if (!is_distributed_checkpoint(dir)) {
    throw CheckpointError(
        fmt::format("'{}' is not a committed checkpoint; the tracker in '{}' still names the last "
                    "one that is",
                    dir, root_));
  }
  io::write_file_atomic(root_ + "/" + kTrackerFile, std::to_string(iteration) + "\n");
  // The new checkpoint and the tracker are durable: a failed removal of an
  // old one is worth a warning, not a failed save.
  try {
    prune(iteration);
  } catch (const std::exception& e) {
    log_message(LogLevel::kWarning,
                fmt::format("CheckpointManager: removing old checkpoints under '{}' failed: {}", root_, e.what()));
  }
}

std::optional<int64_t> CheckpointManager::latest_iteration() const {
  const std::string tracker = root_ + "/" + kTrackerFile;
  if (!io::exists(tracker)) return std::nullopt;
  std::string text = io::read_file(tracker, 64);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const std::optional<int64_t> iteration = iteration_of(kIterPrefix + text);
  if (!iteration) {
    throw CheckpointError(
        fmt::format("'{}' holds '{}', not an iteration number; it was damaged or written by another "
                    "tool. Remove it and name the checkpoint to load",
                    tracker, text));
  }
  if (!is_distributed_checkpoint(path_for(*iteration))) {
    throw CheckpointError(fmt::format("'{}' names iteration {}, but '{}' is not a committed checkpoint", tracker,
                                      *iteration, path_for(*iteration)));
  }
  return iteration;
}

LoadResult CheckpointManager::load_latest(const StateDict& sharded_state_dict, Communicator& comm,
                                          const LoadOptions& options) const {
  // Rank 0 reads the tracker and tells the others, so every rank loads the
  // same iteration even if the file changes (or a cache is stale) meanwhile.
  std::optional<int64_t> latest;
  run_agreed(comm, "read the latest-checkpoint tracker", [&] {
    if (!comm.is_coordinator()) return;
    latest = latest_iteration();
    if (!latest) {
      throw CheckpointError(fmt::format("'{}' has no {}: no checkpoint was committed there", root_, kTrackerFile));
    }
  });
  const std::string chosen = comm.broadcast_bytes(latest ? std::to_string(*latest) : std::string(), 0);
  return load(sharded_state_dict, path_for(std::stoll(chosen)), comm, options);
}

std::vector<CheckpointEntry> CheckpointManager::list() const {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  std::optional<int64_t> latest;
  try {
    latest = latest_iteration();
  } catch (const CheckpointError&) {
    // A damaged tracker marks nothing latest; the listing still helps repair it.
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(root_)) {
    const std::optional<int64_t> iteration = iteration_of(entry.path().filename().string());
    if (!iteration || !entry.is_directory(ec) || entry.is_symlink(ec)) continue;
    CheckpointEntry e;
    e.iteration = *iteration;
    e.path = entry.path().string();
    try {
      e.committed = is_distributed_checkpoint(e.path);
    } catch (const Error&) {
      e.committed = false;  // a damaged marker: not a checkpoint a load would take
    }
    e.latest = latest == iteration;
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.iteration < b.iteration; });
  return out;
}

void CheckpointManager::prune(int64_t kept_iteration) const {
  if (keep_last_ == 0) return;
  // Only iterations older than the one just committed are candidates: newer
  // ones (left by a run that was resumed from an earlier checkpoint) stay.
  std::vector<CheckpointEntry> committed;
  for (CheckpointEntry& e : list()) {
    if (e.committed && e.iteration < kept_iteration) committed.push_back(std::move(e));
  }
  // Newest first; the one just committed counts as one of keep_last.
  std::sort(committed.begin(), committed.end(), [](const auto& a, const auto& b) { return a.iteration > b.iteration; });
  for (size_t i = keep_last_ - 1; i < committed.size(); ++i) {
    // The marker goes first: a removal cut short never leaves a directory
    // that looks committed but lacks its data.
    io::remove_tree(committed[i].path + "/" + kCommitFile);
    io::fsync_dir(committed[i].path);
    io::remove_tree(committed[i].path);
  }
  if (committed.size() >= keep_last_) io::fsync_dir(root_);
}

}  // namespace distckpt
