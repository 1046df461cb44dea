// What a checkpoint directory says about itself: its commit marker
// (metadata.json) parsed, like Megatron's maybe_load_config.
#pragma once

#include <optional>
#include <string>

namespace distckpt {

struct CheckpointConfig {
  std::string format;           // "distckpt"
  int version = 0;              // format version
  std::string sharded_backend;  // "distckpt-fb"
  std::string common_backend;   // "distckpt-fb"
  int world_size = 0;
  std::string created_by;  // library version that wrote it
};

// Parses DIR/metadata.json; nullopt when the directory has none (not a
// committed checkpoint). Throws CheckpointError for a malformed file or an
// unsupported format/version.
std::optional<CheckpointConfig> maybe_load_config(const std::string& dir);
bool is_distributed_checkpoint(const std::string& dir);

}  // namespace distckpt
