// PyTorch DCP's `.metadata` (what torch.distributed.checkpoint, Megatron's
// torch_dist and torchtitan write): a pickle of dataclasses, read by the
// restricted pickle machine against an allow-list of the classes torch 1.13
// and 2.x name (and Megatron's MCoreMetadata), so nothing in the file is
// imported or run. What it says is checked as it is read: shapes, chunks
// inside their tensors, every chunk and item with a storage entry whose
// file name stays inside the checkpoint.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "distckpt/core/box.h"
#include "distckpt/format/storage_index.h"

namespace distckpt::dcp {

// Where one item (a chunk of a tensor, or a bytes value) is stored: bytes
// [offset, offset + length) of `relative_path`, after `transforms` (2.x's
// transform_descriptors, "stream.zstd/1" say; empty for plain items).
struct StorageInfo {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::string> transforms;
};

struct Chunk {
  Shape offsets;
  Shape sizes;
  StorageInfo storage;
};

struct Tensor {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  std::optional<UnrepresentableDtype> unrepresentable;  // a dtype this LibTorch lacks
  Shape size;
  std::vector<Chunk> chunks;
};

struct BytesItem {
  std::string key;
  StorageInfo storage;
};

struct Metadata {
  // Which module names the classes came from: "torch 1.13" (torch.distributed
  // ._shard.checkpoint), "torch 2" (torch.distributed.checkpoint); Megatron's
  // MCoreMetadata adds " (Megatron MCoreMetadata)".
  std::string naming;
  std::vector<Tensor> tensors;   // sorted by key
  std::vector<BytesItem> bytes;  // sorted by key
};

// The module paths a `.metadata` names DCP's classes by.
enum class ModuleNaming { kTorch2, kTorch113 };

// `metadata` (its tensors, chunks, bytes items and their storage) pickled as
// PyTorch's FileSystemWriter pickles it under `naming`, for PyTorch's own
// reader: UsageError for a dtype PyTorch has no name for.
std::string encode_metadata(const Metadata& metadata, ModuleNaming naming);

// `.metadata`'s bytes parsed and checked; CorruptionError naming `origin`
// (the file) and the problem for anything else, an unknown global first of all.
Metadata parse_metadata(std::string_view bytes, const std::string& origin);

}  // namespace distckpt::dcp
