#include "storage/directory_commit.h"

#include <fmt/format.h>

#include <exception>
#include <mutex>
#include <set>

#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "distckpt/storage/storage_reader.h"
#include "format/commit.h"
#include "io/file.h"

namespace distckpt::storage {
namespace {

std::mutex& claims_mutex() {
  static std::mutex m;
  return m;
}
std::set<std::string>& claims() {
  static std::set<std::string> s;
  return s;
}

// Committed and durable: a leftover old copy is only clutter, removed by the
// next save.
void remove_previous(const std::string& old_copy, const std::string& target) {
  try {
    io::remove_tree(old_copy);
  } catch (const std::exception& e) {
    log_message(LogLevel::kWarning,
                fmt::format("saved '{}', but removing the previous checkpoint failed: {}", target, e.what()));
  }
}

}  // namespace

InFlightClaim::InFlightClaim(const io::StagingPaths& paths, bool lock_directory) : target_(paths.target) {
  std::lock_guard<std::mutex> lock(claims_mutex());
  if (!claims().insert(target_).second) {
    throw CheckpointError(fmt::format(
        "a save into '{}' is still in flight; finalize it (AsyncCallsQueue::maybe_finalize(true)) before saving "
        "into the same directory again",
        target_));
  }
  if (!lock_directory) return;
  try {
    io::make_dirs(paths.parent);  // a save may name a directory whose parent is still to come
    lock_ = std::make_unique<io::StagingLock>(paths);
  } catch (...) {
    claims().erase(target_);
    throw;
  }
}

InFlightClaim::~InFlightClaim() {
  lock_.reset();  // first: a save of this process that finds the target free must get the lock
  std::lock_guard<std::mutex> lock(claims_mutex());
  claims().erase(target_);
}

void prepare_directory(const io::StagingPaths& paths, bool overwrite) {
  const bool committed = is_distributed_checkpoint(paths.target);
  if (committed && !overwrite) {
    throw CheckpointError(fmt::format(
        "'{}' already holds a committed checkpoint; pass SaveOptions::overwrite = true to replace it (the old one "
        "is removed only after the new one is committed) or save into another directory",
        paths.target));
  }
  if (!committed && io::exists(paths.target) && !io::is_empty_dir(paths.target)) {
    throw CheckpointError(
        fmt::format("'{}' exists, is not empty and holds no committed distckpt checkpoint; remove it or choose another "
                    "directory",
                    paths.target));
  }
  if (io::exists(paths.old)) {
    if (!committed) {
      throw CheckpointError(fmt::format(
          "found '{}' left by an interrupted overwrite of '{}': it holds the previous checkpoint. Rename it back to "
          "'{}' (or delete it) before saving again",
          paths.old, paths.target, paths.target));
    }
    io::remove_tree(paths.old);
  }
  io::remove_tree(paths.staging);  // left by a save that crashed: never committed
  io::make_dirs(paths.staging + "/data");
}

void commit_checkpoint(const io::StagingPaths& paths, CheckpointMetadata metadata, const std::string& common_state,
                       bool overwrite) {
  io::write_file_atomic(paths.staging + "/" + kCommonFile, common_state);
  metadata.common_file = kCommonFile;
  const std::string encoded = encode_metadata(metadata);
  io::write_file_atomic(paths.staging + "/" + kMetadataFile, encoded);
  io::fsync_dir(paths.staging + "/data");
  const CheckpointConfig config = commit_config(metadata.world_size, record_metadata(kMetadataFile, encoded),
                                                record_file(kCommonFile, common_state));
  write_commit_marker(paths.staging, config);

  const bool replacing = overwrite && is_distributed_checkpoint(paths.target);
  if (replacing && io::exchange_paths(paths.staging, paths.target)) {
    // One atomic step: the target name holds the old checkpoint, then the
    // new one, never nothing (a kill -9 at any instant leaves one of them).
    try {
      io::fsync_dir(paths.parent);  // not committed until the exchange is durable
    } catch (const std::exception& e) {
      try {
        io::exchange_paths(paths.staging, paths.target);  // the previous checkpoint back in place
      } catch (const std::exception& undo) {
        throw CheckpointError(fmt::format("{}; undoing the commit failed too ({}); the previous checkpoint is in '{}'",
                                          e.what(), undo.what(), paths.staging));
      }
      throw;
    }
    // The old checkpoint now sits at the staging name; the next save clears
    // it if this fails or the process dies first.
    remove_previous(paths.staging, paths.target);
    return;
  }
  // Where the file system cannot exchange: the old checkpoint is moved aside
  // first; a crash in between leaves it in paths.old, and the next save says
  // how to put it back.
  if (replacing) io::rename_path(paths.target, paths.old);
  bool moved_in = false;
  try {
    io::rename_path(paths.staging, paths.target);  // also replaces an empty target directory
    moved_in = true;
    io::fsync_dir(paths.parent);  // not committed until the renames are durable
  } catch (const std::exception& e) {
    // Undone in reverse: the new checkpoint back to staging (the caller
    // discards it), the previous one back in place. A failed save loses nothing.
    try {
      if (moved_in) io::rename_path(paths.target, paths.staging);
      if (replacing) io::rename_path(paths.old, paths.target);
    } catch (const std::exception& undo) {
      throw CheckpointError(fmt::format("{}; undoing the commit failed too ({}){}", e.what(), undo.what(),
                                        replacing ? "; the previous checkpoint is in '" + paths.old + "'" : ""));
    }
    throw;
  }
  if (replacing) remove_previous(paths.old, paths.target);
}

void discard_staging(const io::StagingPaths& paths) noexcept {
  try {
    io::remove_tree(paths.staging);
  } catch (...) {
    // The original error matters more than a failed clean-up.
  }
}

}  // namespace distckpt::storage
