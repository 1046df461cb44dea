// Global checkpoints of a training run under one root directory (or object
// store prefix: s3://bucket/run), the way Megatron lays them out:
// ROOT/iter_0000100 per saved iteration and
// ROOT/latest_checkpointed_iteration.txt naming the newest committed one.
//
//   CheckpointManager manager(root, /*keep_last=*/3);
//   manager.save(model.state_dict(), iteration, comm);   // collective
//   ...after a restart:
//   if (manager.latest_iteration()) {
//     const LatestLoadResult r = manager.load_latest(model.state_dict(), comm);
//     start_at = r.iteration + 1;   // an older one when the newest was damaged
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/api/checkpoint.h"
#include "distckpt/storage/backend.h"

namespace distckpt {

struct CheckpointManagerOptions {
  size_t keep_last = 0;  // committed checkpoints to keep (0 keeps all)
  // load_latest: when the newest committed checkpoint turns out damaged or
  // incomplete (a CheckpointError, CorruptionError included, on any rank),
  // every rank moves on to the next older committed one. Off: that error.
  bool fall_back = true;
};

// A checkpoint load_latest passed over, and why (the agreed error's message).
struct SkippedCheckpoint {
  int64_t iteration = 0;
  std::string error_class;  // "CorruptionError", "CheckpointError"
  std::string reason;
};

struct LatestLoadResult : LoadResult {
  int64_t iteration = -1;                  // the iteration loaded
  std::vector<SkippedCheckpoint> skipped;  // newer ones passed over, newest first
};

struct CheckpointEntry {
  int64_t iteration = 0;
  std::string path;
  bool committed = false;  // a complete checkpoint (its commit marker is there)
  bool latest = false;     // the tracker names it
};

class CheckpointManager {
 public:
  static constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";

  // keep_last: committed checkpoints to keep (0 keeps all).
  explicit CheckpointManager(std::string root, size_t keep_last = 0);
  CheckpointManager(std::string root, CheckpointManagerOptions options);

  const std::string& root() const { return root_; }
  std::string path_for(int64_t iteration) const;  // ROOT/iter_0000100

  // Collective: saves into path_for(iteration); once it is committed, the
  // save's coordinator (SaveOptions::coordinator_rank) points the tracker at it (written atomically; as Megatron, the
  // iteration just saved, even an earlier one after a rollback) and only then removes older committed checkpoints
  // beyond keep_last (newer ones stay; a failed removal is a warning). A failed save changes neither.
  SaveReport save(const StateDict& sharded_state_dict, int64_t iteration, Communicator& comm,
                  const SaveOptions& options = {});
  // For a save made otherwise (an async save, once finalized): the tracker
  // update and pruning of save(), on one process. CheckpointError unless
  // path_for(iteration) is committed.
  void mark_committed(int64_t iteration);

  // The tracker's iteration; nullopt without a tracker. CheckpointError for
  // a tracker that is not an iteration number or names no committed checkpoint.
  std::optional<int64_t> latest_iteration() const;
  // Collective load of the latest checkpoint: rank 0 reads the tracker and
  // lists the committed iterations up to the one it names; every rank tries
  // them newest first. A load that fails with a CheckpointError (damaged,
  // incomplete) is raised as that class on every rank (distckpt/api/checkpoint.h),
  // so every rank moves on together, and rank 0 logs one warning naming the
  // iteration and the cause (CheckpointManagerOptions::fall_back). Any other
  // error is raised at once. CheckpointError when there is no tracker; when
  // no candidate loads, one error on every rank (the earliest ErrorKind of
  // their causes) naming each iteration tried and why.
  LatestLoadResult load_latest(const StateDict& sharded_state_dict, Communicator& comm,
                               const LoadOptions& options = {}) const;

  // Every iter_* directory (committed or not: a failed save leaves none, an
  // interrupted removal may), by iteration. Symbolic links are not followed.
  std::vector<CheckpointEntry> list() const;

 private:
  void prune(int64_t kept_iteration) const;
  std::unique_ptr<Backend> root_backend() const;
  // Rank 0's list of iterations load_latest tries, newest first.
  std::vector<int64_t> load_candidates() const;

  std::string root_;
  CheckpointManagerOptions options_;
};

}  // namespace distckpt
