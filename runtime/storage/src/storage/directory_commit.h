// Where a distckpt save writes in a directory and how it becomes a
// checkpoint: a hidden staging directory next to the target, filled by every
// rank, committed by the coordinator (metadata, common state, metadata.json
// last) and renamed into place. Neither a failed save nor an overwrite can lose a checkpoint.
#pragma once

#include <memory>
#include <string>

#include "format/metadata.h"
#include "io/staging.h"

namespace distckpt::storage {

// Marks a target as being saved until released, so that two saves in
// flight never share a staging directory: two of this process (e.g.
// asynchronous ones), or of two processes (io::StagingLock).
class InFlightClaim {
 public:
  // CheckpointError if already claimed. Without `lock_directory` (an object
  // store), only saves of this process are kept apart; an object store keeps
  // two jobs apart at commit (storage/object_commit.h).
  InFlightClaim(const io::StagingPaths& paths, bool lock_directory);
  ~InFlightClaim();
  InFlightClaim(const InFlightClaim&) = delete;
  InFlightClaim& operator=(const InFlightClaim&) = delete;

 private:
  std::string target_;
  std::unique_ptr<io::StagingLock> lock_;
};

// Coordinator only: refuses to touch a committed checkpoint unless asked to,
// never deletes a directory it did not create, starts a fresh staging area.
void prepare_directory(const io::StagingPaths& paths, bool overwrite);

// Coordinator only: common state, metadata, the commit marker, then the
// staging directory takes the target's place (replacing an old checkpoint
// only when `overwrite`).
void commit_checkpoint(const io::StagingPaths& paths, CheckpointMetadata metadata, const std::string& common_state,
                       bool overwrite);

// Coordinator only, after a failure: removes the staging directory; never throws.
void discard_staging(const io::StagingPaths& paths) noexcept;

}  // namespace distckpt::storage
