// load() over a reader the caller opens, for the jobs built on a load (a
// live transfer reads its sources through one): what it filled comes back
// too, for callers that check the values.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/load/load.h"
#include "load/checkpoint_reader.h"
#include "load/read_engine.h"

namespace distckpt::loading {

using OpenReader = std::function<std::unique_ptr<CheckpointReader>()>;

// A requested ShardedTensor (factories applied; its data dropped) and the
// tensor that now holds its values.
struct FilledTensor {
  ShardedTensor request;
  at::Tensor values;
};

// What planning the reads of a load exchanged between the ranks, kept to
// load the same requests from the same stored layout again (a transfer
// repeated every step) without those collectives: the needs routed to this
// rank and the schedulers' shares sent to it.
struct ReadPlanMemo {
  bool valid = false;
  std::vector<std::string> read_plans;
  std::vector<std::string> decisions;
};

// What a caller of load_from may watch or reuse; every field optional.
struct LoadHooks {
  std::vector<FilledTensor>* filled = nullptr;  // receives every requested ShardedTensor this rank filled
  // Valid (and no strict key check or access validation asked for, which
  // are collective): the reads are planned from it (every rank must pass a
  // valid memo of the same load, or none); else it is filled once the load
  // succeeded.
  ReadPlanMemo* memo = nullptr;
  std::chrono::steady_clock::time_point* reads_began = nullptr;  // when planning ended and the reads began
  // With a memo to replay only (UsageError otherwise): carried by the reads'
  // first agreement; when it does not hold, load_from returns at once on
  // every rank, having read nothing (an empty LoadResult).
  FirstAgreementCheck* check = nullptr;
};

// Collective: load() with the reader `open` makes (called once, inside the
// opening's agreement).
LoadResult load_from(const StateDict& sharded_state_dict, const OpenReader& open, Communicator& comm,
                     const LoadOptions& options, const LoadHooks& hooks = {});

}  // namespace distckpt::loading
