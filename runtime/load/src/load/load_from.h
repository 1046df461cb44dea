// load() over a reader the caller opens, for the jobs built on a load (a
// live transfer reads its sources through one): what it filled comes back
// too, for callers that check the values.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/load/load.h"
#include "load/checkpoint_reader.h"

namespace distckpt::loading {

using OpenReader = std::function<std::unique_ptr<CheckpointReader>()>;

// A requested ShardedTensor (factories applied; its data dropped) and the
// tensor that now holds its values.
struct FilledTensor {
  ShardedTensor request;
  at::Tensor values;
};

// Collective: load() with the reader `open` makes (called once, inside the
// opening's agreement). `filled`, when given, receives every requested
// ShardedTensor this rank filled.
LoadResult load_from(const StateDict& sharded_state_dict, const OpenReader& open, Communicator& comm,
                     const LoadOptions& options, std::vector<FilledTensor>* filled = nullptr);

}  // namespace distckpt::loading
