// What a checkpoint says about itself: its commit marker (metadata.json),
// parsed like Megatron's maybe_load_config (distckpt/storage/storage_reader.h
// reads it from any location).
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
  // Format 3, metadata.fb only: its first head_bytes bytes (the index of its
  // records) and their XXH3, so that a rank can read the head and then only
  // its own records (each checked against the index).
  uint64_t head_bytes = 0;
  uint64_t head_xxh3 = 0;
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

}  // namespace distckpt
