// The global metadata of a checkpoint (metadata.fb) as plain C++ values, and
// its FlatBuffers encoding. Parsing treats the bytes as untrusted: the buffer
// is verified, then every record is checked for internal consistency.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/errors.h"
#include "distckpt/format/name_mapping.h"
#include "distckpt/format/storage_index.h"

namespace distckpt {

// 2: metadata.json records the size and XXH3 of metadata.fb and common.fb.
// Version 1 checkpoints (no such record) still load.
constexpr uint32_t kFormatVersion = 2;
constexpr uint32_t kOldestFormatVersion = 1;
constexpr const char* kFormatName = "distckpt";

// The distckpt format's metadata: the storage index plus what only this
// format records.
struct CheckpointMetadata : StorageIndex {
  uint32_t format_version = kFormatVersion;
  int32_t world_size = 1;
  std::string common_file;  // relative path of the common state ("" = none)
  // Which layout wrote it (filled by the generated API; free-form otherwise).
  std::string layout_name;
  std::string layout_fingerprint;
  std::string layout_schema;
  // The save plan (see plan/global_plan.h): each rank's structure hash and
  // the writer policy name. Empty when not recorded.
  std::vector<uint64_t> plan_hashes;
  std::string writer_policy;
  // The layout schema's name mappings under the saved config.
  std::vector<NameMapping> name_mappings;
};

std::string encode_metadata(const CheckpointMetadata& metadata);
// Verifies the FlatBuffers buffer and the records: shapes and boxes agree,
// boxes inside the global shape, flat ranges inside boxes, byte lengths =
// elements * dtype size, checksum counts match, file indices valid, sorted
// unique keys. `origin` names the file in messages. Throws CorruptionError.
CheckpointMetadata decode_metadata(std::string_view bytes, const std::string& origin);
// The error for `path`, a file the metadata lists, that does not exist: the
// checkpoint is incomplete (CorruptionError with path() set), whoever looks.
CorruptionError missing_listed_file(const std::string& path);
// CorruptionError naming `path` unless it has the `recorded` size.
void check_file_size(const std::string& path, uint64_t actual, uint64_t recorded);

}  // namespace distckpt
