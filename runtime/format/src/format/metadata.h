// The global metadata of a checkpoint (metadata.fb) as plain C++ values, and
// its FlatBuffers encoding. Parsing treats the bytes as untrusted: the buffer
// is verified, then every record is checked for internal consistency.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/box.h"

namespace distckpt {

// 2: metadata.json records the size and XXH3 of metadata.fb and common.fb.
// Version 1 checkpoints (no such record) still load.
constexpr uint32_t kFormatVersion = 2;
constexpr uint32_t kOldestFormatVersion = 1;
constexpr const char* kFormatName = "distckpt";

// One stored piece of a tensor: the box it covers and, for flattened
// (ZeRO) chunks, the slice of the box's row-major flattening actually stored.
struct ChunkRecord {
  Box box;
  std::optional<FlatRange> flat;
  uint32_t file = 0;                      // index into CheckpointMetadata::files
  uint64_t byte_offset = 0;               // in that file
  uint64_t byte_length = 0;               // = stored elements * dtype size
  std::vector<uint64_t> block_checksums;  // one per block_size bytes
  int64_t stored_numel() const { return flat ? flat->size() : box.numel(); }
};

struct TensorRecord {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  Shape global_shape;
  std::vector<ChunkRecord> chunks;
};

struct ObjectRecord {
  std::string key;
  Shape global_shape;
  Shape global_offset;
  uint32_t file = 0;
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  std::vector<uint64_t> block_checksums;
  std::string unique_key() const;
};

struct FileRecord {
  std::string path;  // relative to the checkpoint directory
  uint64_t size = 0;
  int32_t writer_rank = 0;
};

struct CheckpointMetadata {
  uint32_t format_version = kFormatVersion;
  int32_t world_size = 1;
  uint64_t checksum_block_size = 0;
  std::vector<TensorRecord> tensors;  // sorted by key, unique keys
  std::vector<ObjectRecord> objects;  // sorted by unique key
  std::vector<FileRecord> files;
  std::string common_file;  // relative path of the common state ("" = none)
  // Which layout wrote it (filled by the generated API; free-form otherwise).
  std::string layout_name;
  std::string layout_fingerprint;
  std::string layout_schema;
  // The save plan (see plan/global_plan.h): each rank's structure hash and
  // the writer policy name. Empty when not recorded.
  std::vector<uint64_t> plan_hashes;
  std::string writer_policy;

  const TensorRecord* find_tensor(const std::string& key) const;  // binary search
};

std::string encode_metadata(const CheckpointMetadata& metadata);
// Verifies the FlatBuffers buffer and the records: shapes and boxes agree,
// boxes inside the global shape, flat ranges inside boxes, byte lengths =
// elements * dtype size, checksum counts match, file indices valid, sorted
// unique keys. `origin` names the file in messages. Throws CorruptionError.
CheckpointMetadata decode_metadata(std::string_view bytes, const std::string& origin);
// Checks every record against the actual data files (sizes, path safety).
void check_files(const CheckpointMetadata& metadata, const std::string& dir);

}  // namespace distckpt
