// Global checkpoints of a training run under one root directory, the way
// Megatron lays them out: ROOT/iter_0000100 per saved iteration and
// ROOT/latest_checkpointed_iteration.txt naming the newest committed one.
//
//   CheckpointManager manager(root, /*keep_last=*/3);
//   manager.save(model.state_dict(), iteration, comm);   // collective
//   ...after a restart:
//   if (manager.latest_iteration()) manager.load_latest(model.state_dict(), comm);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/api/checkpoint.h"

namespace distckpt {

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
  // Collective load of the latest checkpoint (rank 0 reads the tracker and
  // tells the others); CheckpointError when there is none.
  LoadResult load_latest(const StateDict& sharded_state_dict, Communicator& comm,
                         const LoadOptions& options = {}) const;

  // Every iter_* directory (committed or not: a failed save leaves none, an
  // interrupted removal may), by iteration. Symbolic links are not followed.
  std::vector<CheckpointEntry> list() const;

 private:
  void prune(int64_t kept_iteration) const;

  std::string root_;
  size_t keep_last_;
};

}  // namespace distckpt
