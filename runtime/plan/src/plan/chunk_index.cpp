#include "plan/chunk_index.h"

#include <algorithm>

#include "format/dtype.h"
#include "plan/coverage.h"

namespace distckpt::plan {
namespace {

// The axis along which the pieces have the most distinct starts: the one
// they were split along. Indexing axis 0 alone would make every query of a
// column-split tensor visit every piece (ranks x chunks over a load).
size_t split_axis(const std::vector<StoredPiece>& pieces, size_t ndim) {
  size_t best = 0;
  size_t best_count = 0;
  std::vector<int64_t> starts;
  starts.reserve(pieces.size());
  for (size_t d = 0; d < ndim; ++d) {
    starts.clear();
    for (const StoredPiece& p : pieces) starts.push_back(p.box.offset[d]);
    std::sort(starts.begin(), starts.end());
    const auto count = static_cast<size_t>(std::unique(starts.begin(), starts.end()) - starts.begin());
    if (count > best_count) {
      best = d;
      best_count = count;
    }
  }
  return best;
}

}  // namespace

ChunkIndex::ChunkIndex(const TensorRecord& record, const WriterOf& writer_of) {
  const uint64_t element = record.element_size();
  for (uint32_t c = 0; c < record.chunks.size(); ++c) {
    const ChunkRecord& chunk = record.chunks[c];
    if (!chunk.flat) {
      if (!chunk.box.empty()) pieces_.push_back(StoredPiece{chunk.box, c, 0});
      continue;
    }
    for (const FlatPiece& p : decompose_flat_range(chunk.box, *chunk.flat)) {
      pieces_.push_back(StoredPiece{p.box, c, static_cast<uint64_t>(p.flat_start - chunk.flat->start) * element});
    }
  }
  // Counting the elements a region's pieces hold would let an overlap hide a
  // hole: the stored chunks must tile the tensor exactly, checked once.
  std::vector<OwnedBox> boxes;
  boxes.reserve(pieces_.size());
  for (const StoredPiece& p : pieces_) boxes.push_back(OwnedBox{p.box, writer_of(record.chunks[p.chunk].file)});
  check_exact_cover(record.key, record.global_shape, boxes, CoverSubject::kStoredChunks);
  if (record.global_shape.empty()) return;  // scalars: every piece matches
  axis_ = split_axis(pieces_, record.global_shape.size());
  const size_t d = axis_;
  std::sort(pieces_.begin(), pieces_.end(),
            [d](const StoredPiece& a, const StoredPiece& b) { return a.box.offset[d] < b.box.offset[d]; });
  running_max_end_.resize(pieces_.size());
  int64_t max_end = 0;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    max_end = std::max(max_end, pieces_[i].box.offset[d] + pieces_[i].box.length[d]);
    running_max_end_[i] = max_end;
  }
}

void ChunkIndex::query(const Box& region, std::vector<const StoredPiece*>& out) const {
  if (region.ndim() == 0) {
    for (const StoredPiece& p : pieces_) out.push_back(&p);
    return;
  }
  if (region.empty()) return;
  const size_t d = axis_;
  const int64_t lo = region.offset[d];
  const int64_t hi = lo + region.length[d];
  // Pieces starting before `hi`, walked backwards until none can reach `lo`.
  auto end = std::lower_bound(pieces_.begin(), pieces_.end(), hi,
                              [d](const StoredPiece& p, int64_t v) { return p.box.offset[d] < v; });
  for (size_t i = static_cast<size_t>(end - pieces_.begin()); i-- > 0;) {
    if (running_max_end_[i] <= lo) break;
    if (intersect(pieces_[i].box, region)) out.push_back(&pieces_[i]);
  }
}

}  // namespace distckpt::plan
