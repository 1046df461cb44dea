// Does a set of boxes tile a global shape exactly once? Used to validate the
// main replicas of every tensor before a save.
#pragma once

#include <string>
#include <vector>

#include "distckpt/core/box.h"

namespace distckpt::plan {

struct OwnedBox {
  Box box;
  int rank;
};

// Throws ShardingError (naming `key`, the ranks and the boxes) when two boxes
// overlap or part of `global_shape` is covered by none. Empty boxes are
// ignored. Cost: O(n log n) plus the number of cells of the grid formed by
// all box boundaries when that grid is at most a small multiple of n (every
// regular or uneven-but-aligned layout); otherwise a sweep over axis 0 that
// compares only boxes whose axis-0 ranges overlap.
void check_exact_cover(const std::string& key, const Shape& global_shape, const std::vector<OwnedBox>& boxes);

}  // namespace distckpt::plan
