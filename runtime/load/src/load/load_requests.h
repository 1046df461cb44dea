// What a load request needs from storage: each requested ShardedTensor is
// checked against the stored tensor, given a destination (the caller's data,
// or a new CPU tensor), zero-filled where it reaches past a padded stored
// shape, and turned into reads: parts of stored pieces, each landing in a
// view of the destination. Any chunk grid, prepended axes and flat ranges.
#pragma once

#include <vector>

#include "distckpt/core/state_dict.h"
#include "load/checkpoint_reader.h"
#include "plan/load_schedule.h"

namespace distckpt::loading {

struct TensorRead {
  plan::PieceNeed need;  // the part of a stored piece
  at::Tensor dest;       // where it goes; sizes = need.part.length
};

// Appends the reads of `request` to `reads` and returns the tensor the caller
// gets back. Throws ShardingError for an incompatible dtype or shape and
// CheckpointError when the checkpoint does not hold all of the request.
// `convert_dtype`: a floating-point request may differ from the stored
// floating-point dtype (the values are converted as they are copied).
at::Tensor plan_tensor_reads(CheckpointReader& reader, const ShardedTensor& request, std::vector<TensorRead>& reads,
                             bool convert_dtype = false);

// A ShardedObject's stored bytes as a string Value (KeyMismatchError when absent).
Value load_object(CheckpointReader& reader, const ShardedObject& object);

}  // namespace distckpt::loading
