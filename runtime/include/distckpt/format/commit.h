// metadata.json: written last by the coordinator; its presence marks a
// committed checkpoint. Also the config loader (like Megatron's
// maybe_load_config) and the checks that guard a directory before saving.
#pragma once

#include <optional>
#include <string>

namespace distckpt {

constexpr const char* kCommitFile = "metadata.json";
constexpr const char* kMetadataFile = "metadata.fb";

struct CheckpointConfig {
  std::string format;      // "distckpt"
  int version = 0;         // format version
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
// Writes DIR/metadata.json atomically (temp + fsync + rename + dir fsync).
void write_commit_marker(const std::string& dir, const CheckpointConfig& config);

}  // namespace distckpt
