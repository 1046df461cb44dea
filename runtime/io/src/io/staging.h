// Where a directory being written lives until it is complete: a hidden
// sibling of its target, renamed into place at commit. Saves and exports
// share the names, so a crashed run of either is cleaned up by the next.
#pragma once

#include <string>

namespace distckpt::io {

struct StagingPaths {
  std::string target;   // normalised: "ckpt/" -> "ckpt"
  std::string parent;   // the directory holding all three ("." when none)
  std::string staging;  // ".<name>.distckpt-staging"
  std::string old;      // ".<name>.distckpt-old": a replaced target until the new one is in place
};

// Throws CheckpointError for a path that names no directory ("", ".", "..").
StagingPaths staging_paths(const std::string& dir);

}  // namespace distckpt::io
