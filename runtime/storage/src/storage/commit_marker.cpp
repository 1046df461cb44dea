// Reading a checkpoint's commit marker from wherever it lives.
#include "storage/commit_marker.h"

#include <optional>
#include <string>

#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_reader.h"
#include "format/commit.h"

namespace distckpt {

std::optional<std::string> storage::read_commit_marker(Backend& backend) {
  if (!backend.size_of(kCommitFile)) return std::nullopt;
  return backend.read_small(kCommitFile, max_commit_marker_bytes());
}

std::optional<CheckpointConfig> maybe_load_config(const std::string& location) {
  const std::unique_ptr<Backend> backend = open_backend(location);
  const std::optional<std::string> text = storage::read_commit_marker(*backend);
  if (!text) return std::nullopt;
  return config_of_marker(*text, backend->describe(kCommitFile));
}

bool is_distributed_checkpoint(const std::string& location) { return maybe_load_config(location).has_value(); }

std::optional<std::string> checkpoint_writer(const std::string& location) {
  const std::unique_ptr<Backend> backend = open_backend(location);
  const std::optional<std::string> text = storage::read_commit_marker(*backend);
  if (!text) return std::nullopt;
  return writer_of_marker(*text, backend->describe(kCommitFile));
}

}  // namespace distckpt
