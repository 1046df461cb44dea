// The steps of save planning that the central planner (global_plan.h) and
// the partitioned one (partitioned_plan.h) share, so both decide alike:
// grouping the items of local plans into distinct stored shards, choosing a
// writer for each, and the records of the metadata skeleton.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/plan/writer_policy.h"
#include "plan/global_plan.h"
#include "plan/local_plan.h"

namespace distckpt::plan {

// One item of one plan. `plan` indexes the plans given (not necessarily the
// rank: a planner holds only the plans of the ranks that sent it items).
struct ItemRef {
  uint32_t order;  // rank of the item's key (tensors) or unique key (objects) in sorted order
  uint32_t plan;
  uint32_t item;
};

// A distinct stored shard: a run [begin, end) of ItemRefs, by ascending rank.
struct ShardGroup {
  bool is_object;
  size_t begin, end;
  uint64_t bytes;
};

// Every item grouped into distinct shards, tensors first (in key, box, flat
// order), then objects (in unique-key order). Plans must be ordered by rank.
struct Grouping {
  std::vector<ItemRef> refs;
  std::vector<ShardGroup> groups;
};
Grouping group_items(const std::vector<LocalPlan>& plans);

const ShardPlan& tensor_of(const std::vector<LocalPlan>& plans, const ItemRef& r);
const ObjectPlan& object_of(const std::vector<LocalPlan>& plans, const ItemRef& r);

// Writer decisions, one per group: the index into refs of the writer's item,
// kNotWritten (no main replica, or a tensor shard without elements), or
// kShared: held by several ranks under the balanced policy, decided by
// balance_within_holder_sets.
constexpr int64_t kNotWritten = -1;
constexpr int64_t kShared = -2;
std::vector<int64_t> choose_unshared_writers(const std::vector<LocalPlan>& plans, const Grouping& g,
                                             WriterPolicy policy);

// A stored shard held by several ranks, as the balanced policy sees it.
struct SharedShard {
  bool is_object = false;
  std::string name;  // key (tensors) or unique key (objects)
  Box box;
  int64_t flat_start = -1, flat_stop = -1;
  uint64_t bytes = 0;
  std::vector<int> holders;  // ranks, ascending, distinct
  uint32_t id = 0;           // the caller's, passed through
};
SharedShard shared_shard(const std::vector<LocalPlan>& plans, const Grouping& g, size_t group);

// The balanced policy: shards held by the same set of ranks are balanced
// among those ranks, largest first to the least loaded (counting only that
// set's shards); ties go round the set from a point its hash picks, so sets
// do not all start at their lowest rank. Sets are independent, so each can be
// decided wherever all of its shards are. Returns the chosen rank per shard;
// the result does not depend on the order of `shards`.
std::vector<int> balance_within_holder_sets(const std::vector<SharedShard>& shards);

// The index into refs of `rank`'s item in a group: its main replica when it
// holds several copies. Throws ProtocolError when `rank` holds none.
size_t ref_of_rank(const std::vector<LocalPlan>& plans, const Grouping& g, const ShardGroup& group, int rank);

// The metadata skeleton's records, each with its writer's rank.
struct PlannedChunk {
  Box box;
  std::optional<FlatRange> flat;
  int writer = 0;
};
struct PlannedTensor {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  Shape global_shape;
  std::vector<PlannedChunk> chunks;  // (box, flat) order; none for a tensor without elements
};
struct PlannedObject {
  std::string key;
  Shape global_shape, global_offset;
  int writer = 0;
};
struct PlannedRecords {
  std::vector<PlannedTensor> tensors;  // by key
  std::vector<PlannedObject> objects;  // by unique key
};
// From decided writers (no kShared left).
PlannedRecords planned_records(const std::vector<LocalPlan>& plans, const Grouping& g,
                               const std::vector<int64_t>& writer);

// The skeleton, files (one per writing rank) and slots of `world` ranks.
// Records must be sorted and their keys distinct.
GlobalSavePlan assemble_global_plan(const PlannedRecords& records, int world);

}  // namespace distckpt::plan
