// This rank's shard of a tensor given as a whole: for converting a
// non-distributed checkpoint, or for deterministic models in tests/examples.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "distckpt/core/state_dict.h"

namespace distckpt::layout {

// The whole tensor stored under `key` with `global_shape` (prepended axes included).
using GlobalTensorFn = std::function<at::Tensor(const std::string& key, const Shape& global_shape)>;

// The local tensor for an entry of a (metadata) state dict: a ShardedTensor's
// box (or flat range) cut out of its global tensor, or a factory's parts cut
// out one by one and merged as a load would merge them. Returns a new tensor.
at::Tensor local_from_global(const Value& entry, const GlobalTensorFn& global);

}  // namespace distckpt::layout
