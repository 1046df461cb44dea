// Box geometry: intersections, containment and the split of a flat range of a
// box's row-major flattening into contiguous boxes.
#include "distckpt/core/box.h"

#include <fmt/format.h>

#include <algorithm>

#include "distckpt/core/errors.h"

namespace distckpt {

int64_t numel(const Shape& shape) {
  // A zero anywhere makes the product 0 even when the extents before it
  // would overflow int64 (shapes from untrusted files are checked only for
  // a representable element count).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent;
  return n;
}

int64_t Box::numel() const { return distckpt::numel(length); }

namespace {

void require_same_rank(const Box& a, const Box& b, const char* operation) {
  if (a.ndim() != b.ndim()) {
    throw UsageError(
        fmt::format("{}: boxes of different rank ({} vs {}): {} and {}; both boxes must "
                    "describe the same global tensor",
                    operation, a.ndim(), b.ndim(), to_string(a), to_string(b)));
  }
}

std::string join(const Shape& values) { return fmt::format("{}", fmt::join(values, ", ")); }

}  // namespace

std::optional<Box> intersect(const Box& a, const Box& b) {
  require_same_rank(a, b, "intersect");
  Box out;
  out.offset.resize(a.ndim());
  out.length.resize(a.ndim());
  for (size_t axis = 0; axis < a.ndim(); ++axis) {
    const int64_t lo = std::max(a.offset[axis], b.offset[axis]);
    const int64_t hi = std::min(a.offset[axis] + a.length[axis], b.offset[axis] + b.length[axis]);
    if (hi <= lo) return std::nullopt;
    out.offset[axis] = lo;
    out.length[axis] = hi - lo;
  }
  return out;
}

bool contains(const Box& outer, const Box& inner) {
  require_same_rank(outer, inner, "contains");
  for (size_t axis = 0; axis < outer.ndim(); ++axis) {
    // In 128 bits: a peer's box may hold any offsets and lengths.
    const __int128 inner_end = static_cast<__int128>(inner.offset[axis]) + inner.length[axis];
    const __int128 outer_end = static_cast<__int128>(outer.offset[axis]) + outer.length[axis];
    if (inner.offset[axis] < outer.offset[axis] || inner.length[axis] < 0 || inner_end > outer_end) return false;
  }
  return true;
}

namespace {

// Splits the flat range [start, stop) of the sub-block of `parent` that fixes
// the indices of axes [0, axis) to `prefix`. Positions are relative to that
// sub-block; `block_flat_start` is the sub-block's position in the parent.
//
// A range aligned to whole rows of `axis` is one box. Otherwise it is a head
// (the rest of a partial first row, a suffix one axis down), a middle of
// whole rows and a tail (the start of a partial last row, a prefix one axis
// down). Suffixes and prefixes each cost at most one box per axis, which
// bounds the total by 2*ndim-1.
class FlatRangeSplitter {
 public:
  explicit FlatRangeSplitter(const Box& parent) : parent_(parent) {
    // inner_[a] = elements in one index step of axis a.
    inner_.assign(parent.ndim(), 1);
    for (size_t a = parent.ndim(); a-- > 1;) inner_[a - 1] = inner_[a] * parent.length[a];
  }

  std::vector<FlatPiece> split(FlatRange range) {
    prefix_.clear();
    split_block(0, 0, range.start, range.stop);
    return std::move(pieces_);
  }

 private:
  void split_block(size_t axis, int64_t block_flat_start, int64_t start, int64_t stop) {
    const int64_t row = inner_[axis];
    if (start % row == 0 && stop % row == 0) {
      emit_rows(axis, block_flat_start, start / row, stop / row);
      return;
    }
    int64_t first_row = start / row;
    const int64_t last_row = stop / row;  // row holding the tail (if stop is unaligned)
    if (first_row == last_row) {
      descend(axis, block_flat_start, first_row, start - first_row * row, stop - first_row * row);
      return;
    }
    if (start % row != 0) {
      descend(axis, block_flat_start, first_row, start - first_row * row, row);
      ++first_row;
    }
    if (last_row > first_row) emit_rows(axis, block_flat_start, first_row, last_row);
    if (stop % row != 0) descend(axis, block_flat_start, last_row, 0, stop - last_row * row);
  }

  // Recurses into row `index` of `axis`, fixing that index.
  void descend(size_t axis, int64_t block_flat_start, int64_t index, int64_t start, int64_t stop) {
    prefix_.push_back(index);
    split_block(axis + 1, block_flat_start + index * inner_[axis], start, stop);
    prefix_.pop_back();
  }

  // Emits rows [first, last) of `axis`, whole along every deeper axis.
  void emit_rows(size_t axis, int64_t block_flat_start, int64_t first, int64_t last) {
    FlatPiece piece;
    piece.box = parent_;  // deeper axes: whole extent at the parent's offset
    for (size_t a = 0; a < axis; ++a) {
      piece.box.offset[a] += prefix_[a];
      piece.box.length[a] = 1;
    }
    piece.box.offset[axis] += first;
    piece.box.length[axis] = last - first;
    piece.flat_start = block_flat_start + first * inner_[axis];
    pieces_.push_back(std::move(piece));
  }

  const Box& parent_;
  Shape inner_;
  Shape prefix_;
  std::vector<FlatPiece> pieces_;
};

}  // namespace

std::vector<FlatPiece> decompose_flat_range(const Box& parent, FlatRange range) {
  const int64_t total = parent.numel();
  if (range.start < 0 || range.stop > total || range.start > range.stop) {
    throw UsageError(
        fmt::format("decompose_flat_range: flat range [{}, {}) is not inside [0, {}] of "
                    "box {}; the flat range must index the box's row-major flattening",
                    range.start, range.stop, total, to_string(parent)));
  }
  if (range.size() == 0) return {};
  if (parent.ndim() == 0) return {FlatPiece{parent, 0}};  // the range can only be [0, 1)
  return FlatRangeSplitter(parent).split(range);
}

Shape contiguous_strides(const Shape& shape) {
  // Like LibTorch, a zero extent counts as 1 so strides stay distinct.
  Shape strides(shape.size(), 1);
  for (size_t a = shape.size(); a-- > 1;) strides[a - 1] = strides[a] * std::max<int64_t>(shape[a], 1);
  return strides;
}

std::string to_string(const Shape& shape) { return "[" + join(shape) + "]"; }

std::string to_string(const Box& box) {
  return fmt::format("offset {} length {}", to_string(box.offset), to_string(box.length));
}

}  // namespace distckpt
