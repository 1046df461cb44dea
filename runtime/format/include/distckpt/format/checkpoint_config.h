// What a checkpoint directory says about itself: its commit marker
// (metadata.json) parsed, like Megatron's maybe_load_config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace distckpt {

// A file whose size and XXH3-64 the commit marker records (format version 2
// on): a flipped bit in it cannot go unnoticed, since the marker is parsed
// strictly and every reader checks the file against it before decoding.
struct RecordedFile {
  std::string path;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

struct CheckpointConfig {
  std::string format;           // "distckpt"
  int version = 0;              // format version
  std::string sharded_backend;  // "distckpt-fb"
  std::string common_backend;   // "distckpt-fb"
  // Megatron's per-backend versions. distckpt versions its backends with the
  // format (one number covers every file's layout), so both equal `version`;
  // they are not separate fields of the marker.
  int sharded_backend_version = 0;
  int common_backend_version = 0;
  int world_size = 0;
  std::string created_by;  // library version that wrote it
  // Version 2 on (absent in version 1): the global metadata and the common state.
  std::optional<RecordedFile> metadata;
  std::optional<RecordedFile> common;
};

// Parses DIR/metadata.json; nullopt when the directory has none (not a
// committed checkpoint) or has one another program wrote (a Megatron
// torch_dist checkpoint, say). Throws CorruptionError for a damaged marker
// and CheckpointError for one written by a newer distckpt.
std::optional<CheckpointConfig> maybe_load_config(const std::string& dir);
bool is_distributed_checkpoint(const std::string& dir);
// Which program committed DIR: "distckpt", the other tool's name as its
// marker gives it ("torch_dist"), or nullopt without a marker. Throws
// CorruptionError for a damaged marker of ours.
std::optional<std::string> checkpoint_writer(const std::string& dir);

}  // namespace distckpt
