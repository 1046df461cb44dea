// A location as a backend: a directory or prefix, or one file in one.
#pragma once

#include <memory>
#include <string>

#include "distckpt/storage/backend.h"

namespace distckpt::storage {

struct Located {
  // The location itself; for a single file, the directory or prefix holding it.
  std::shared_ptr<Backend> backend;
  std::string file;  // that file's name under `backend`; "" for a directory or prefix
};
// A local path that is a regular file (links followed: the user named it)
// or an s3:// URL naming one object is a single file; anything else a root.
Located locate(const std::string& location);

}  // namespace distckpt::storage
