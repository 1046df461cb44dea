// Loading one requested leaf (ShardedTensor or ShardedObject) from a reader,
// resharding as needed: any chunk grid, prepended axes, flat ranges, and
// padded tensors (allow_shape_mismatch) that are zero-filled or truncated.
#pragma once

#include "api/checkpoint_reader.h"
#include "distckpt/core/state_dict.h"

namespace distckpt::api {

// Fills the tensor's data in place when it has data (else allocates on CPU)
// and returns it; for an object, returns its bytes as a string Value.
Value load_leaf(CheckpointReader& reader, const Value& leaf);
at::Tensor load_sharded_tensor(CheckpointReader& reader, const ShardedTensor& request);

}  // namespace distckpt::api
