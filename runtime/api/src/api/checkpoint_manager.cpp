// CheckpointManager: iteration directories (or prefixes of an object store),
// the tracker file and keep-last-N.
#include "distckpt/api/checkpoint_manager.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "distckpt/format/checkpoint_config.h"
#include "distckpt/storage/backend.h"
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

// The tracker's iteration; nullopt without a tracker. CheckpointError for
// text that is not an iteration number.
std::optional<int64_t> read_tracker(Backend& root) {
  const std::string tracker = root.describe(CheckpointManager::kTrackerFile);
  if (!root.size_of(CheckpointManager::kTrackerFile)) return std::nullopt;
  std::string text = root.read_small(CheckpointManager::kTrackerFile, 64);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const std::optional<int64_t> iteration = iteration_of(kIterPrefix + text);
  if (!iteration) {
    throw CheckpointError(fmt::format("'{}' holds '{}', not an iteration number; it was damaged or written by another "
                                      "tool. Remove it and name the checkpoint to load",
                                      tracker, text),
                          tracker);
  }
  return iteration;
}

// The iter_* folders of an object store root (one listing of their objects).
std::vector<std::string> object_store_iterations(Backend& root) {
  std::set<std::string> names;
  for (const StoredObject& o : root.list(kIterPrefix)) {
    const size_t slash = o.name.find('/');
    if (slash != std::string::npos) names.insert(o.name.substr(0, slash));
  }
  return {names.begin(), names.end()};
}

// Removes a committed checkpoint, its marker first: a removal cut short
// never leaves something that looks committed but lacks its data.
void remove_checkpoint(const std::string& path) {
  if (is_object_store(path)) {
    const std::unique_ptr<Backend> backend = open_backend(path);
    backend->remove(kCommitFile);
    for (const StoredObject& o : backend->list("")) backend->remove(o.name);
    backend->abort_unfinished("");  // uploads a killed save left
    return;
  }
  io::remove_tree(path + "/" + kCommitFile);
  io::fsync_dir(path);
  io::remove_tree(path);
}

// Iterations as the text "300 200 100", for the broadcast.
std::string encode_iterations(const std::vector<int64_t>& iterations) {
  return fmt::format("{}", fmt::join(iterations, " "));
}

std::vector<int64_t> decode_iterations(const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  for (int64_t i = 0; in >> i;) out.push_back(i);
  if (!in.eof()) throw ProtocolError(fmt::format("rank 0 sent a malformed list of iterations '{}'", text));
  return out;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string root, size_t keep_last)
    : CheckpointManager(std::move(root), CheckpointManagerOptions{keep_last}) {}

CheckpointManager::CheckpointManager(std::string root, CheckpointManagerOptions options)
    : root_(std::move(root)), options_(options) {
  while (root_.size() > 1 && root_.back() == '/' && root_.compare(root_.size() - 2, 2, ":/") != 0) root_.pop_back();
}

std::unique_ptr<Backend> CheckpointManager::root_backend() const { return open_backend(root_); }

std::string CheckpointManager::path_for(int64_t iteration) const {
  if (iteration < 0) throw UsageError(fmt::format("CheckpointManager: iteration {} is negative", iteration));
  return fmt::format("{}/{}{:07d}", root_, kIterPrefix, iteration);
}

SaveReport CheckpointManager::save(const StateDict& sharded_state_dict, int64_t iteration, Communicator& comm,
                                   const SaveOptions& options) {
  const std::string dir = path_for(iteration);
  // The save's coordinator, which committed it, also updates the tracker.
  const bool coordinator = comm.rank() == options.coordinator_rank;
  run_agreed(comm, "create the checkpoint root", [&] {
    if (coordinator && !is_object_store(root_)) io::make_dirs(root_);
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
  root_backend()->publish(kTrackerFile, std::to_string(iteration) + "\n", /*if_absent=*/false);
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
  const std::optional<int64_t> iteration = read_tracker(*root_backend());
  if (iteration && !is_distributed_checkpoint(path_for(*iteration))) {
    throw CheckpointError(fmt::format("'{}/{}' names iteration {}, but '{}' is not a committed checkpoint", root_,
                                      kTrackerFile, *iteration, path_for(*iteration)));
  }
  return iteration;
}

std::vector<int64_t> CheckpointManager::load_candidates() const {
  const std::optional<int64_t> tracked = read_tracker(*root_backend());
  if (!tracked) {
    throw CheckpointError(fmt::format("'{}' has no {}: no checkpoint was committed there", root_, kTrackerFile));
  }
  if (!options_.fall_back) return {*latest_iteration()};
  // The tracked one and the older committed ones; newer ones (left by a run
  // resumed from an earlier checkpoint) are not what the tracker chose.
  std::vector<int64_t> candidates;
  for (const CheckpointEntry& e : list()) {
    if (e.committed && e.iteration <= *tracked) candidates.push_back(e.iteration);
  }
  std::sort(candidates.rbegin(), candidates.rend());
  if (candidates.empty()) {
    throw CheckpointError(
        fmt::format("'{}/{}' names iteration {}, but neither it nor any older iteration under '{}' "
                    "is a committed checkpoint",
                    root_, kTrackerFile, *tracked, root_));
  }
  if (candidates.front() != *tracked) {
    log_message(LogLevel::kWarning,
                fmt::format("CheckpointManager: '{}/{}' names iteration {}, which is not a committed checkpoint; "
                            "trying iteration {} and older",
                            root_, kTrackerFile, *tracked, candidates.front()));
  }
  return candidates;
}

LatestLoadResult CheckpointManager::load_latest(const StateDict& sharded_state_dict, Communicator& comm,
                                                const LoadOptions& options) const {
  // Rank 0 reads the tracker and the listing and tells the others, so every
  // rank tries the same iterations even if the files change meanwhile.
  std::vector<int64_t> candidates;
  run_agreed(comm, "read the latest-checkpoint tracker", [&] {
    if (comm.is_coordinator()) candidates = load_candidates();
  });
  candidates = decode_iterations(comm.broadcast_bytes(encode_iterations(candidates), 0));
  LatestLoadResult result;
  std::vector<ErrorKind> kinds;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int64_t iteration = candidates[i];
    try {
      static_cast<LoadResult&>(result) = load(sharded_state_dict, path_for(iteration), comm, options);
      result.iteration = iteration;
      return result;
    } catch (const CheckpointError& e) {
      // Raised alike on every rank (a load agrees on its errors), so every
      // rank takes this branch for the same iteration.
      if (!options_.fall_back) throw;
      result.skipped.push_back({iteration, e.class_name(), e.what()});
      kinds.push_back(e.kind());
      if (comm.is_coordinator()) {
        log_message(LogLevel::kWarning,
                    fmt::format("CheckpointManager: iteration {} under '{}' does not load ({}): {}{}", iteration, root_,
                                e.class_name(), e.what(),
                                i + 1 < candidates.size() ? "; falling back to the next older checkpoint" : ""));
      }
    }
  }
  std::string reasons;
  for (const SkippedCheckpoint& s : result.skipped) {
    reasons += fmt::format("\n  iteration {} ({}): {}", s.iteration, s.error_class, s.reason);
  }
  throw_error(*std::min_element(kinds.begin(), kinds.end()),
              fmt::format("no committed checkpoint under '{}' loads; tried {} iteration(s), newest first:{}", root_,
                          result.skipped.size(), reasons));
}

std::vector<CheckpointEntry> CheckpointManager::list() const {
  std::vector<CheckpointEntry> out;
  const bool object_store = is_object_store(root_);
  std::vector<std::string> names;
  if (object_store) {
    names = object_store_iterations(*root_backend());
  } else {
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return out;
    for (const std::string& name : io::list_dir(root_)) {
      // Links are not followed.
      if (fs::is_directory(fs::symlink_status(fs::path(root_) / name, ec))) names.push_back(name);
    }
  }
  if (names.empty()) return out;
  std::optional<int64_t> latest;
  try {
    latest = latest_iteration();
  } catch (const CheckpointError&) {
    // A damaged tracker marks nothing latest; the listing still helps repair it.
  }
  for (const std::string& name : names) {
    const std::optional<int64_t> iteration = iteration_of(name);
    if (!iteration) continue;
    CheckpointEntry e;
    e.iteration = *iteration;
    e.path = root_ + "/" + name;
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
  const size_t keep_last = options_.keep_last;
  if (keep_last == 0) return;
  // Only iterations older than the one just committed are candidates: newer
  // ones (left by a run that was resumed from an earlier checkpoint) stay.
  std::vector<CheckpointEntry> committed;
  for (CheckpointEntry& e : list()) {
    if (e.committed && e.iteration < kept_iteration) committed.push_back(std::move(e));
  }
  // Newest first; the one just committed counts as one of keep_last.
  std::sort(committed.begin(), committed.end(), [](const auto& a, const auto& b) { return a.iteration > b.iteration; });
  for (size_t i = keep_last - 1; i < committed.size(); ++i) {
    remove_checkpoint(committed[i].path);
  }
  if (committed.size() >= keep_last && !is_object_store(root_)) io::fsync_dir(root_);
}

}  // namespace distckpt
