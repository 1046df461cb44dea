// The planning half of a save, shared by save() and async_save(): the state
// dict prepared, this rank's assignment (what it writes), and on the
// coordinator the metadata skeleton, the staging directory and a snapshot of
// the common state. Reuses the plan cache when every rank's structure
// matches it (see distckpt/save/plan_cache.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/state_dict_split.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/save/options.h"
#include "distckpt/save/plan_cache.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_writer.h"
#include "plan/global_plan.h"
#include "storage/distckpt_storage.h"
#include "storage/distckpt_writer.h"

namespace distckpt {

struct SavePlanCache::State {
  bool valid = false;
  std::vector<uint64_t> hashes;                        // each rank's structure hash the plan was made for
  std::vector<uint32_t> assignment;                    // this rank's items, canonical order
  std::shared_ptr<const plan::GlobalSavePlan> global;  // coordinator only
  // from_checkpoint, until used: ranks look their own records up in it, the
  // coordinator decodes it whole.
  std::shared_ptr<const storage::DistckptStorage> seed;
  uint64_t made = 0;
  uint64_t reused = 0;

  // What this rank believes the cached plan is for (0: nothing cached).
  uint64_t digest() const;
};

// The planner's access to a cache's state (private to users).
struct SavePlanCacheAccess {
  using State = SavePlanCache::State;
  static State& state(SavePlanCache& cache) { return *cache.state_; }
};

namespace saving {

struct PreparedSave {
  std::string target;  // the writer's location
  SaveOptions options;
  int rank = 0;
  int world_size = 1;
  int coordinator = 0;                        // SaveOptions::coordinator_rank, checked
  SplitStateDict split;                       // owns the leaves below
  std::vector<const ShardedTensor*> tensors;  // local plan items 0 .. n-1
  std::vector<at::ScalarType> stored_dtypes;  // of `tensors` (SaveOptions::transform)
  std::vector<const ShardedObject*> objects;  // local plan items n ..
  std::vector<uint32_t> assignment;           // items this rank writes, canonical order
  bool plan_reused = false;
  std::vector<uint64_t> plan_hashes;  // every rank's structure hash
  StorageWriter* writer = nullptr;    // the caller's, or owned_writer
  std::unique_ptr<StorageWriter> owned_writer;
  // The writer when it is distckpt's own (async and streamed saves use it
  // directly), and what it reads from the plan.
  storage::DistckptWriter* distckpt = nullptr;
  storage::DistckptSave distckpt_save;
  bool claimed = false;    // the coordinator's writer claimed the target: discard() after a failure
  bool direct_io = false;  // this rank's data file was written with O_DIRECT
  bool is_coordinator() const { return rank == coordinator; }

  // Coordinator only:
  std::shared_ptr<const plan::GlobalSavePlan> global;
};

// Collective. Errors on any rank are raised on every rank. `writer` null:
// the format SaveOptions::format names, at `dir`; otherwise `dir` is its location.
std::unique_ptr<PreparedSave> prepare_save(const StateDict& state_dict, const std::string& dir, Communicator& comm,
                                           const SaveOptions& options, StorageWriter* writer = nullptr);

// The index save() would write (see dry_run_save in distckpt/api/checkpoint.h).
StorageIndex dry_run(const StateDict& state_dict, Communicator& comm, const SaveOptions& options);

// The digest of all ranks' structure hashes: what a cache records.
uint64_t plan_digest(const std::vector<uint64_t>& hashes);

}  // namespace saving
}  // namespace distckpt
