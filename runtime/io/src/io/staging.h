// Where a directory being written lives until it is complete: a hidden
// sibling of its target, renamed into place at commit. Saves and exports
// share the names, so a crashed run of either is cleaned up by the next.
#pragma once

#include <string>

#include "io/unique_fd.h"

namespace distckpt::io {

struct StagingPaths {
  std::string target;   // normalised: "ckpt/" -> "ckpt"
  std::string parent;   // the directory holding all three ("." when none)
  std::string staging;  // ".<name>.distckpt-staging"
  std::string old;      // ".<name>.distckpt-old": a replaced target until the new one is in place
  std::string lock;     // ".<name>.distckpt-lock": held while a writer uses the staging name
};

// Throws CheckpointError for a path that names no directory ("", ".", "..").
StagingPaths staging_paths(const std::string& dir);

// Keeps every other writer of the same target out of its staging name while
// this one writes: an exclusive flock on the lock file, which is removed on
// release. A second save or export of the target (another job, another
// process, or another export in this one) is refused at once instead of
// clearing the staging area in use and committing a mix. The kernel drops
// the lock of a killed process; its file is reused. Where the file system
// has no locks (flock fails with ENOLCK or EOPNOTSUPP), a warning says so
// and the write goes on unguarded.
class StagingLock {
 public:
  // CheckpointError when another writer holds it; IoError when the lock file
  // cannot be created or locked.
  explicit StagingLock(const StagingPaths& paths);
  ~StagingLock();  // removes the lock file, then unlocks
  StagingLock(const StagingLock&) = delete;
  StagingLock& operator=(const StagingLock&) = delete;

 private:
  std::string path_;
  UniqueFd fd_;
};

}  // namespace distckpt::io
