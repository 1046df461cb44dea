// metadata.json: written last by the coordinator; its presence marks a
// committed checkpoint. The reading side is public (checkpoint_config.h).
#pragma once

#include <string>

#include "distckpt/format/checkpoint_config.h"

namespace distckpt {

constexpr const char* kCommitFile = "metadata.json";
constexpr const char* kMetadataFile = "metadata.fb";

// Writes DIR/metadata.json atomically (temp + fsync + rename + dir fsync).
void write_commit_marker(const std::string& dir, const CheckpointConfig& config);

}  // namespace distckpt
