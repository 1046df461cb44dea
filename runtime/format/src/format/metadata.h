// The global metadata of a checkpoint (metadata.fb) as plain C++ values, and
// its FlatBuffers encoding. Parsing treats the bytes as untrusted: the buffer
// is verified, then every record is checked for internal consistency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/errors.h"
#include "distckpt/format/name_mapping.h"
#include "distckpt/format/storage_index.h"

namespace distckpt {

// 2: metadata.json records the size and XXH3 of metadata.fb and common.fb.
// 3: metadata.fb indexes its tensor records (keys, where each lies, its XXH3)
//    in a head whose size and XXH3 the marker records, and each chunk says
//    where its file record lies: a rank reads the head and its own records.
// Version 1 and 2 checkpoints still load.
constexpr uint32_t kFormatVersion = 3;
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

// Format 3 when metadata.format_version is 3 (the default), else the layout
// of the version it names (tests write older checkpoints with it).
std::string encode_metadata(const CheckpointMetadata& metadata);
// The size of an encoded buffer's head (format 3; the whole buffer before).
uint64_t metadata_head_bytes(std::string_view encoded);
// Verifies the FlatBuffers buffer and the records: shapes and boxes agree,
// boxes inside the global shape, flat ranges inside boxes, byte lengths =
// elements * dtype size, checksum counts match, file indices valid, sorted
// unique keys. `origin` names the file in messages. Throws CorruptionError.
CheckpointMetadata decode_metadata(std::string_view bytes, const std::string& origin);
// metadata.fb opened for lookups by key. The buffer's frame, every record
// but the tensors' and the order of the tensor keys (sorted, unique) are
// checked at once; a tensor record is verified, checked and decoded when
// asked for, so that a rank loading a few tensors of a large checkpoint
// decodes those alone. decode_all also checks that no two records share
// bytes (a load reads only the bytes its own requests size). After a record
// fails, every later tensor() reports that failure. The lookups (find,
// lower_bound, key_at) touch nothing mutable and may run on any threads,
// beside a tensor() too; tensor() calls must not overlap (callers lock).
//
// A format 3 file can also be opened from its head alone: each tensor record,
// and each file record a chunk names, is then read (`read`), checked against
// its XXH3 in the index and decoded when first asked for, so that a rank
// reads O(its records) bytes of a metadata.fb that grows with the world.
class LazyMetadata {
 public:
  // Reads `length` bytes at `offset` of the file into `out`.
  using RangeRead = std::function<void(uint64_t offset, uint64_t length, uint8_t* out)>;

  // CorruptionError (or CheckpointError for a newer format) as decode_metadata.
  LazyMetadata(std::string bytes, std::string origin);
  // `head`: the first bytes of a format 3 file of `file_size` bytes, already
  // checked against the commit marker's XXH3.
  LazyMetadata(std::string head, uint64_t file_size, RangeRead read, std::string origin);
  ~LazyMetadata();
  LazyMetadata(const LazyMetadata&) = delete;
  LazyMetadata& operator=(const LazyMetadata&) = delete;

  // Everything but the tensors (`tensors` is empty).
  const CheckpointMetadata& header() const;
  size_t tensor_count() const;
  // The place of `key` among the records, and of the first key not less
  // than `key` (tensor_count() when none): binary searches over keys alone.
  std::optional<size_t> find(const std::string& key) const;
  size_t lower_bound(const std::string& key) const;
  // The key of record `i` (< tensor_count()), its record not decoded.
  std::string_view key_at(size_t i) const;
  // Record `i` (< tensor_count()), checked as decode_metadata checks it.
  TensorRecord tensor(size_t i);
  // The file record `index` of a record decoded so far (read alone), or of
  // the whole file's list: std::out_of_range when neither has it, nullptr
  // from find_file. Thread-safe, beside tensor() too.
  const FileRecord& file(uint32_t index) const;
  const FileRecord* find_file(uint32_t index) const;
  size_t file_count() const;
  // Every file record: opened from the head, the file list (the file's
  // tail after the tensor records) is read once, alone. Calls must not
  // overlap tensor() calls (callers lock).
  const std::vector<FileRecord>& files();
  // Bytes of the file read so far (the whole file when opened from bytes).
  uint64_t bytes_read() const;
  // The whole metadata, checked (decode_metadata). Opened from the head, the
  // caller reads the whole file and checks it against the marker instead.
  CheckpointMetadata decode_all() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The error for `path`, a file the metadata lists, that does not exist: the
// checkpoint is incomplete (CorruptionError with path() set), whoever looks.
CorruptionError missing_listed_file(const std::string& path);
// CorruptionError naming `path` unless it has the `recorded` size.
void check_file_size(const std::string& path, uint64_t actual, uint64_t recorded);

}  // namespace distckpt
