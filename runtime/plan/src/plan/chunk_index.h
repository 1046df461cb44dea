// An index over the stored chunks of one tensor: which stored bytes overlap a
// requested region. Flat (ZeRO) chunks are split into boxes that are
// contiguous in the file, so every lookup is box geometry.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "distckpt/core/box.h"
#include "format/metadata.h"

namespace distckpt::plan {

// A box of a tensor stored row-major and contiguously, starting
// `byte_in_chunk` bytes after the first byte of chunk `chunk`.
struct StoredPiece {
  Box box;
  uint32_t chunk = 0;
  uint64_t byte_in_chunk = 0;
};

class ChunkIndex {
 public:
  // The rank that wrote a file of the checkpoint.
  using WriterOf = std::function<int32_t(uint32_t file)>;

  // Throws CorruptionError unless the stored chunks tile the tensor exactly
  // (`writer_of` names the writers in the message).
  ChunkIndex(const TensorRecord& record, const WriterOf& writer_of);

  // Appends the pieces that intersect `region` to `out`. Pieces are sorted by
  // their start on the axis that tells most of them apart (axis 1 for a
  // column split) with a running maximum of their end there, so a query
  // visits only pieces whose range on that axis can reach the region.
  void query(const Box& region, std::vector<const StoredPiece*>& out) const;
  const std::vector<StoredPiece>& pieces() const { return pieces_; }
  size_t axis() const { return axis_; }

 private:
  std::vector<StoredPiece> pieces_;
  size_t axis_ = 0;
  std::vector<int64_t> running_max_end_;  // max end on axis_ of pieces_[0..i]
};

}  // namespace distckpt::plan
