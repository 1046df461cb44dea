// One rank's tensor-aware state dict without its tensor bytes (the "hollow"
// form): tensor metadata, objects, common state. What TensorAwareStateDict
// holds besides its tensors; its encoding is format/local_state_codec.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/core/sharded_object.h"
#include "distckpt/core/sharded_tensor.h"
#include "distckpt/core/state_dict.h"

namespace distckpt {

struct LocalTensorEntry {
  ShardedTensor meta;  // data undefined
  bool held = true;    // false: another rank keeps the data (fully parallel)
  std::string device = "cpu";
  // Filled by the file writer: where the bytes are and their checksums.
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  std::vector<uint64_t> block_checksums;
};

struct LocalState {
  int32_t owner_rank = 0;
  int32_t world_size = 1;
  int64_t iteration = 0;
  std::string algorithm = "atomic";
  uint64_t checksum_block_size = uint64_t{1} << 20;
  std::vector<LocalTensorEntry> tensors;
  std::vector<ShardedObject> objects;  // with their bytes
  Value common;                        // plain values only
};

}  // namespace distckpt
