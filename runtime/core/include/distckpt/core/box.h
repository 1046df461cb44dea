// Boxes (hyper-rectangles) of a global tensor and flat ranges of a box's
// row-major flattening: the geometry every planner and reader works in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace distckpt {

using Shape = std::vector<int64_t>;

// Half-open range [start, stop) of a row-major flattening.
struct FlatRange {
  int64_t start = 0;
  int64_t stop = 0;
  int64_t size() const { return stop - start; }
  bool operator==(const FlatRange& o) const { return start == o.start && stop == o.stop; }
  bool operator!=(const FlatRange& o) const { return !(*this == o); }
};

struct Box {
  Shape offset;  // first index on every axis
  Shape length;  // extent on every axis (may be 0)

  size_t ndim() const { return offset.size(); }
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  bool operator==(const Box& o) const { return offset == o.offset && length == o.length; }
  bool operator!=(const Box& o) const { return !(*this == o); }
  bool operator<(const Box& o) const { return offset != o.offset ? offset < o.offset : length < o.length; }
};

int64_t numel(const Shape& shape);

// Intersection of two boxes of the same rank; nullopt when they do not meet
// (or meet in an empty box).
std::optional<Box> intersect(const Box& a, const Box& b);

// True when `inner` lies inside `outer`.
bool contains(const Box& outer, const Box& inner);

// A piece of a flat range: a box inside `parent` whose elements are contiguous
// in the parent's row-major order and appear in that order, starting at flat
// position `flat_start` of the parent.
struct FlatPiece {
  Box box;             // absolute coordinates (parent.offset added)
  int64_t flat_start;  // position of box's first element in the parent flattening
};

// Splits the flat range `range` of `parent` into at most 2*ndim-1 boxes, each
// contiguous in the parent's row-major order. Together they cover exactly the
// range, in order. This turns flat-range (ZeRO) resharding into box geometry.
std::vector<FlatPiece> decompose_flat_range(const Box& parent, FlatRange range);

// Row-major strides (in elements) of a dense tensor of `shape`.
Shape contiguous_strides(const Shape& shape);

std::string to_string(const Shape& shape);  // "[2, 3]"
std::string to_string(const Box& box);      // "offset [0, 4] length [2, 4]"

}  // namespace distckpt
