// A directory as a Backend: objects are its regular files (below
// subdirectories too), opened as untrusted names of a checkpoint (no link
// leaving the directory, no FIFO or device), written through a temporary
// name and renamed into place once fsync'ed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/storage/backend.h"

namespace distckpt::storage {

class PosixBackend final : public Backend {
 public:
  // Links::kAnywhere: the objects may be links anywhere (a single file the
  // user named, which may itself be a link); kInside: only within `root`.
  enum class Links { kInside, kAnywhere };
  explicit PosixBackend(std::string root, Links links = Links::kInside);

  const std::string& location() const override { return root_; }
  bool root_exists() override;
  std::vector<StoredObject> list(const std::string& prefix, size_t limit = 0, bool below = true) override;
  std::optional<uint64_t> size_of(const std::string& name) override;
  std::unique_ptr<ObjectReader> open(const std::string& name) override;
  std::unique_ptr<ObjectWriter> create(const std::string& name, uint64_t size_hint) override;
  bool publish(const std::string& name, std::string_view bytes, bool if_absent) override;
  void remove(const std::string& name) override;

  // The file system path of `name`.
  std::string path_of(const std::string& name) const;

 private:
  std::string root_;
  Links links_;
};

}  // namespace distckpt::storage
