// TensorAwareStateDict: a sharded state dict split into its tensors and
// everything else (tensor metadata, objects, common values), for local
// (node-level) checkpoints. It can be emptied of its tensors ("hollow": small,
// serialisable), filled again, moved to the CPU and back, written to a file
// by LocalCheckpointManager, and turned back into the caller's state dict.
//
// Local checkpoints load under the layout they were saved with (same world
// size, same shards per rank); resharding is what global checkpoints are for.
//
//   auto tasd = TensorAwareStateDict::from_state_dict(sd, comm, TensorAwareAlgo::kFullyParallel);
//   manager.save(tasd, iteration);                       // node-local, replicated to peers
//   ...after a restart:
//   auto loaded = manager.load();                         // collective; recovers lost ranks from peers
//   LoadResult r = loaded.to_state_dict(request, comm);   // same structure as `request`, tensors filled
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/api/checkpoint.h"
#include "distckpt/api/options.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/format/local_state.h"

namespace distckpt {

enum class TensorAwareAlgo {
  kAtomic,         // every rank keeps all of its shards
  kFullyParallel,  // a replicated shard is kept by one of its holders (balanced bytes); to_state_dict exchanges it
};
TensorAwareAlgo parse_tensor_aware_algo(const std::string& name);  // "atomic", "fully_parallel"
const char* tensor_aware_algo_name(TensorAwareAlgo algo);

// Which holder keeps each replicated shard, reused while every rank's state
// dict keeps its structure (checked with one all-gather of 8 bytes per rank).
// Pass the same object on every call of a rank; each rank has its own.
class ShardDistributionCache {
 public:
  static std::shared_ptr<ShardDistributionCache> create() { return std::make_shared<ShardDistributionCache>(); }
  uint64_t computed() const { return computed_; }
  uint64_t reused() const { return reused_; }

 private:
  friend class TensorAwareStateDict;
  std::vector<uint64_t> hashes_;  // every rank's structure hash when `kept_` was computed
  std::vector<bool> kept_;        // per tensor of this rank: keeps the data
  uint64_t computed_ = 0, reused_ = 0;
};

struct ToStateDictOptions {
  // How the shards reach this rank: kFullyParallel receives those another
  // rank kept (over `parallelization_group`); kAtomic uses only what this rank
  // kept (a ShardingError names a shard it did not keep). Unset: the
  // algorithm the dict was made with (TensorAwareStateDict::algorithm()).
  std::optional<TensorAwareAlgo> algo{};
  // The group the shards were distributed over in from_state_dict (e.g. the
  // data-parallel group): kept shards are looked up and exchanged in it.
  // Null: the communicator passed to to_state_dict.
  Communicator* parallelization_group = nullptr;
  // How shards kept by another rank (fully parallel) arrive: kBroadcast sends
  // each point to point (planned partitioned), kAllGather batches them into
  // rounds of one all-to-all each (planned on every rank from every rank's
  // needs; every rank must pass the same exchange_batch_bytes).
  LoadExchange exchange = LoadExchange::kBroadcast;
  // kAllGather: bytes a rank sends (and receives) per round; kBroadcast: per window.
  uint64_t exchange_batch_bytes = uint64_t{32} << 20;
  StrictHandling strict = StrictHandling::kAssumeOkUnexpected;
  // As LoadOptions::validate_access_integrity: all ranks' requested main
  // replicas must tile each tensor exactly once (one gather).
  bool validate_access_integrity = false;
};

class TensorAwareStateDict {
 public:
  // Factories applied, non-persistent entries dropped (they come back from
  // the request in to_state_dict). kFullyParallel (the default, as in
  // Megatron) is collective: it validates the global sharding and gives each
  // replicated shard to one of its holders, planned as save() plans writers
  // (partitioned: no rank holds every rank's plan), within
  // `parallelization_group` when given (e.g. the data-parallel group: each
  // group keeps one copy of what its members replicate; the global sharding
  // is then not validated, only each group's members take part). kAtomic is
  // local: every rank keeps all of its shards. The tensors are referenced,
  // not copied: copy_tensors_to_cpu() stages them.
  static TensorAwareStateDict from_state_dict(const StateDict& sharded_state_dict, Communicator& comm,
                                              TensorAwareAlgo algo = TensorAwareAlgo::kFullyParallel,
                                              const std::shared_ptr<ShardDistributionCache>& cache = nullptr,
                                              Communicator* parallelization_group = nullptr);
  // From a decoded local checkpoint (hollow or not: see LocalState).
  explicit TensorAwareStateDict(LocalState state, std::vector<at::Tensor> tensors = {});

  // The tensors this rank keeps, in record order; leaves the dict hollow.
  std::vector<at::Tensor> pop_tensors();
  // Fills a hollow dict; shapes and dtypes must be those recorded.
  void insert_tensors(std::vector<at::Tensor> tensors);
  bool is_hollow() const { return hollow_; }
  // Fills a hollow dict with uninitialised tensors of the recorded shapes,
  // dtypes and devices (e.g. to receive bytes).
  void init_tensors();
  // Replaces each kept tensor by a CPU copy (pinned when CUDA is available),
  // remembering its device; restore_tensor_device() moves them back.
  void copy_tensors_to_cpu(bool non_blocking = false);
  void restore_tensor_device(bool non_blocking = false);

  // Collective. `sharded_state_dict` must describe the same shards as were
  // saved (same keys, boxes, flat ranges, dtypes): its tensors are filled in
  // place (or allocated when they carry no data), objects come back as bytes,
  // factories are merged, non-persistent values put back, common values
  // merged in. Shards kept by another rank arrive over `comm`; a shard no rank
  // kept fails every rank. Key mismatches follow options.strict (missing and
  // unexpected keys are returned in the *_RETURN modes).
  LoadResult to_state_dict(const StateDict& sharded_state_dict, Communicator& comm,
                           const ToStateDictOptions& options = {}) const;

  // The hollow form (no tensor bytes) as bytes, and back.
  std::string serialize_hollow() const;
  static TensorAwareStateDict deserialize_hollow(std::string_view bytes, const std::string& origin);

  TensorAwareAlgo algorithm() const;
  const LocalState& state() const { return state_; }
  LocalState& state() { return state_; }
  // One per record; undefined for shards this rank does not keep, or all when hollow.
  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  uint64_t kept_bytes() const;  // payload bytes of the kept tensors

 private:
  TensorAwareStateDict() = default;
  void check_not_hollow(const char* what) const;

  LocalState state_;
  std::vector<at::Tensor> tensors_;
  bool hollow_ = false;
};

}  // namespace distckpt
