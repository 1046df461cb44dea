#include "plan/chunk_index.h"

#include "format/dtype.h"
#include "plan/coverage.h"

namespace distckpt::plan {

ChunkIndex::ChunkIndex(const TensorRecord& record, const std::vector<FileRecord>& files) {
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
  for (const StoredPiece& p : pieces_)
    boxes.push_back(OwnedBox{p.box, files.at(record.chunks[p.chunk].file).writer_rank});
  check_exact_cover(record.key, record.global_shape, boxes, CoverSubject::kStoredChunks);
  if (record.global_shape.empty()) return;  // scalars: every piece matches
  std::sort(pieces_.begin(), pieces_.end(),
            [](const StoredPiece& a, const StoredPiece& b) { return a.box.offset[0] < b.box.offset[0]; });
  running_max_end_.resize(pieces_.size());
  int64_t max_end = 0;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    max_end = std::max(max_end, pieces_[i].box.offset[0] + pieces_[i].box.length[0]);
    running_max_end_[i] = max_end;
  }
}

void ChunkIndex::query(const Box& region, std::vector<const StoredPiece*>& out) const {
  if (region.ndim() == 0) {
    for (const StoredPiece& p : pieces_) out.push_back(&p);
    return;
  }
  if (region.empty()) return;
  const int64_t lo = region.offset[0];
  const int64_t hi = lo + region.length[0];
  // Pieces starting before `hi`, walked backwards until none can reach `lo`.
  auto end = std::lower_bound(pieces_.begin(), pieces_.end(), hi,
                              [](const StoredPiece& p, int64_t v) { return p.box.offset[0] < v; });
  for (size_t i = static_cast<size_t>(end - pieces_.begin()); i-- > 0;) {
    if (running_max_end_[i] <= lo) break;
    if (intersect(pieces_[i].box, region)) out.push_back(&pieces_[i]);
  }
}

}  // namespace distckpt::plan
