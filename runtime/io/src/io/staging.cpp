#include "io/staging.h"

#include <fmt/format.h>

#include <filesystem>

#include "distckpt/core/errors.h"

namespace distckpt::io {

StagingPaths staging_paths(const std::string& dir) {
  std::filesystem::path target = std::filesystem::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "ckpt/" -> "ckpt"
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    throw CheckpointError(fmt::format("cannot write a checkpoint into '{}': name a directory", dir));
  }
  const std::filesystem::path parent = target.parent_path();
  return StagingPaths{target.string(), parent.empty() ? "." : parent.string(),
                      (parent / ("." + name + ".distckpt-staging")).string(),
                      (parent / ("." + name + ".distckpt-old")).string()};
}

}  // namespace distckpt::io
