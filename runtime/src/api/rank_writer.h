// Writes one rank's chunks into its data file: sequential writes, one
// checksum per block, fsync at the end. The result is a metadata fragment
// the coordinator merges into the global metadata.
#pragma once

#include <string>

#include "distckpt/core/sharded_object.h"
#include "distckpt/core/sharded_tensor.h"
#include "distckpt/format/metadata.h"
#include "distckpt/io/file.h"

namespace distckpt::api {

class RankWriter {
 public:
  // `relative_path` is the file's path inside the checkpoint directory.
  RankWriter(const std::string& checkpoint_dir, std::string relative_path, int rank, uint64_t block_size);

  void write_tensor(const ShardedTensor& tensor);
  void write_object(const ShardedObject& object);
  // fsync + close. Fragment: tensors (sorted by key) and objects whose chunks
  // point at file 0 = this rank's file. Empty if nothing was written (and no
  // file is left behind).
  CheckpointMetadata finish();

 private:
  uint64_t append(const void* data, size_t n, std::vector<uint64_t>& checksums);

  std::string dir_;
  std::string relative_path_;
  int rank_;
  uint64_t block_size_;
  io::File file_;
  uint64_t offset_ = 0;
  std::map<std::string, TensorRecord> tensors_;
  std::vector<ObjectRecord> objects_;
};

}  // namespace distckpt::api
