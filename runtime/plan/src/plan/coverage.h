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

// What the boxes are: the main replicas a save is about to write (a bad
// sharding: ShardingError) or the chunks a checkpoint stores (a corrupt
// checkpoint: CorruptionError).
enum class CoverSubject { kMainReplicas, kStoredChunks };

// Throws (naming `key`, the ranks and the boxes) when two boxes overlap or
// part of `global_shape` is covered by none. Empty boxes are ignored. Cost:
// O(n log n) plus the number of cells of the grid formed by all box
// boundaries when that grid is at most a small multiple of n (every regular
// or uneven-but-aligned layout); otherwise a sweep, O(n log n) when the boxes
// split at most two axes. For stored chunks splitting more, the comparisons
// are bounded (CorruptionError past a few seconds' worth).
void check_exact_cover(const std::string& key, const Shape& global_shape, const std::vector<OwnedBox>& boxes,
                       CoverSubject subject = CoverSubject::kMainReplicas);

}  // namespace distckpt::plan
