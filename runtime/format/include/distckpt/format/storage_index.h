// What a checkpoint stores and where, whatever its format: each tensor's
// dtype and global shape, the chunks that hold it (a box, or a flat slice
// of one) at byte ranges of the checkpoint's files, and the byte ranges of
// its serialized objects. A storage backend (distckpt/storage/) fills one
// from its own metadata; the load planner and the read engine use nothing
// else, so a new backend needs no change to either.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/core/box.h"

namespace distckpt {

// One stored piece of a tensor: the box it covers and, for flattened
// (ZeRO) chunks, the slice of the box's row-major flattening actually stored.
struct ChunkRecord {
  Box box;
  std::optional<FlatRange> flat;
  uint32_t file = 0;                      // index into StorageIndex::files
  uint64_t byte_offset = 0;               // in that file
  uint64_t byte_length = 0;               // = stored elements * dtype size
  std::vector<uint64_t> block_checksums;  // one per checksum block; empty when the format records none
  int64_t stored_numel() const { return flat ? flat->size() : box.numel(); }
};

// A stored dtype this build cannot represent: float8 or uint16/32/64 under a
// LibTorch without them, or a dtype added by a newer distckpt.
struct UnrepresentableDtype {
  std::string name;  // as stored ("float8_e4m3fn")
  uint32_t element_size = 0;
};

struct TensorRecord {
  std::string key;
  // at::ScalarType::Undefined when `unrepresentable` is set: such a tensor is
  // listed, verified, digested and compared (as bytes), but not loaded.
  at::ScalarType dtype = at::kFloat;
  Shape global_shape;
  std::vector<ChunkRecord> chunks;
  std::optional<UnrepresentableDtype> unrepresentable{};
  size_t element_size() const;
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

struct StorageIndex {
  // A reader holds a block in memory to check it: larger blocks are refused
  // (at save and in metadata read from disk).
  static constexpr uint64_t kMaxChecksumBlockSize = uint64_t{1} << 30;

  std::vector<TensorRecord> tensors;  // sorted by key, unique keys
  std::vector<ObjectRecord> objects;  // sorted by unique key
  std::vector<FileRecord> files;
  uint64_t checksum_block_size = 0;  // 0: no checksums recorded

  const TensorRecord* find_tensor(const std::string& key) const;  // binary search
};

}  // namespace distckpt
