#include "io/staging.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "io/file.h"

namespace distckpt::io {

StagingPaths staging_paths(const std::string& dir) {
  std::filesystem::path target = std::filesystem::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "ckpt/" -> "ckpt"
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    throw UsageError(fmt::format("cannot write a checkpoint into '{}': name a directory", dir));
  }
  const std::filesystem::path parent = target.parent_path();
  return StagingPaths{
      target.string(), parent.empty() ? "." : parent.string(), (parent / ("." + name + ".distckpt-staging")).string(),
      (parent / ("." + name + ".distckpt-old")).string(), (parent / ("." + name + ".distckpt-lock")).string()};
}

StagingLock::StagingLock(const StagingPaths& paths) : path_(paths.lock) {
  // A holder releasing the lock removes its file after we opened it: then
  // the lock we got is on a file no one else will see, and we try again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    UniqueFd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd.valid()) {
      // Said in terms of the target: the lock file is ours, the folder the user's.
      const int err = errno;
      if (err == ENOENT) {
        throw IoError(fmt::format("cannot write '{}': the folder '{}' does not exist; create it first", paths.target,
                                  paths.parent),
                      paths.parent, err);
      }
      throw IoError(fmt::format("cannot write '{}': cannot create the lock file '{}' beside it: {}", paths.target,
                                path_, std::strerror(err)),
                    path_, err);
    }
    int rc;
    do {
      rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno == EWOULDBLOCK) {
      throw CheckpointError(
          fmt::format(
              "another save or export is writing '{}' (it holds '{}'); wait for it to finish or write elsewhere "
              "(nothing was written)",
              paths.target, path_),
          paths.target);
    }
    if (rc != 0 && (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS)) {
      log_message(LogLevel::kWarning, fmt::format("the file system of '{}' has no locks ({}): nothing keeps another "
                                                  "writer of the same target out while this one writes",
                                                  path_, std::strerror(errno)));
      fd_ = std::move(fd);
      return;
    }
    if (rc != 0) {
      const int err = errno;
      throw IoError(fmt::format("cannot lock '{}': {}", path_, std::strerror(err)), path_, err);
    }
    struct stat held {
    }, named{};
    if (::fstat(fd.get(), &held) == 0 && ::lstat(path_.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      fd_ = std::move(fd);
      return;
    }
  }
  throw IoError(fmt::format("cannot lock '{}': it was replaced 100 times while being locked", path_), path_);
}

StagingLock::~StagingLock() {
  if (fd_.valid()) ::unlink(path_.c_str());  // before unlocking: see the constructor
}

}  // namespace distckpt::io
