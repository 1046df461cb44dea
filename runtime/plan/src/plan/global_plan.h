// The coordinator's view of a save: every rank's local plan turned into
// "who writes what" and a metadata skeleton that write results fill in.
//
// Writers: every distinct stored shard (key, box, flat range) whose group
// holds a main replica is written exactly once, by one of the ranks that hold
// it (any replica id). The choice is a pure function of the plans, so it
// never needs a negotiation round, and it is cached while the structure of
// the state dict is unchanged (distckpt/save/plan_cache.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "distckpt/plan/writer_policy.h"
#include "format/metadata.h"
#include "plan/local_plan.h"

namespace distckpt::plan {

// Where write result k of a rank goes in the skeleton.
struct WriteSlot {
  bool is_object = false;
  uint32_t index = 0;  // tensor index (is_object false) or object index
  uint32_t chunk = 0;  // chunk index within that tensor
};

struct GlobalSavePlan {
  // Keys, dtypes, shapes, chunk boxes and flat ranges, objects and files;
  // chunk byte lengths are set, offsets and checksums come from the writers.
  CheckpointMetadata skeleton;
  // Per rank: the local plan items it writes, in canonical write order
  // (sort_canonically), and the matching skeleton slots.
  std::vector<std::vector<uint32_t>> assignments;
  std::vector<std::vector<WriteSlot>> slots;
  std::vector<uint64_t> bytes_per_rank;  // payload bytes each rank writes
};

// The data file of a rank, relative to the checkpoint directory.
std::string rank_file_path(int rank);

// Fills slots and bytes_per_rank from the skeleton's chunk files.
void index_slots(GlobalSavePlan& plan, size_t world);

// Chooses one writer per distinct shard under `policy`. Expects plans that
// passed validate_global_plan (each tensor group has exactly one main).
// Balanced: shards held by one rank go to it; the others are balanced within
// each set of ranks that hold the same shards (balance_within_holder_sets in
// shard_groups.h), which the partitioned planner can decide where that set's
// shards meet. Cost O(S log S) in the number of shard plans S; memory O(S).
std::vector<std::vector<uint32_t>> distribute_writers(const std::vector<LocalPlan>& plans, WriterPolicy policy);

// validate_global_plan + distribute_writers + the skeleton. Throws
// ShardingError for an invalid global sharding.
GlobalSavePlan make_global_save_plan(const std::vector<LocalPlan>& plans, WriterPolicy policy,
                                     bool check_access = true);

// The same plan recovered from a committed checkpoint's metadata, for reuse
// after a restart: the writer of each chunk is its file's writer_rank.
// `world_size` ranks; assignments are left empty (each rank recovers its own
// with local_assignment_from_metadata).
GlobalSavePlan global_plan_from_metadata(const CheckpointMetadata& metadata);

// This rank's assignment in canonical order, recovered from a checkpoint
// whose plan had the same structure: the items whose (key, box, flat) or
// object key the metadata lists in a file written by `rank`. Throws
// CheckpointError if an item is not in the metadata at all.
std::vector<uint32_t> local_assignment_from_metadata(const CheckpointMetadata& metadata, const LocalPlan& plan,
                                                     int rank);
// The same with the tensors' records looked up one by one (`find`: nullptr
// when absent), the objects of `outline` (its tensors and files unused) and
// each file's writer from `writer_of`: a rank reads only the records of its
// own keys and the files they name.
using RecordLookup = std::function<const TensorRecord*(const std::string& key)>;
using WriterOf = std::function<int32_t(uint32_t file)>;
std::vector<uint32_t> local_assignment_from_metadata(const StorageIndex& outline, const RecordLookup& find,
                                                     const WriterOf& writer_of, const LocalPlan& plan, int rank);
// Whether every object this rank holds the main replica of was written by
// this rank in `metadata`. Checkpoints from before objects were always
// written by their main replica may record another holder: such a plan is
// made again rather than reused.
bool objects_written_by_main_replicas(const StorageIndex& metadata, const WriterOf& writer_of, const LocalPlan& plan,
                                      int rank);
inline bool objects_written_by_main_replicas(const CheckpointMetadata& metadata, const LocalPlan& plan, int rank) {
  return objects_written_by_main_replicas(
      metadata, [&](uint32_t file) { return metadata.files.at(file).writer_rank; }, plan, rank);
}

struct ItemWrite {
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  std::vector<uint64_t> block_checksums;
};

struct WriteResults {
  int rank = 0;
  uint64_t file_size = 0;
  std::vector<ItemWrite> items;  // canonical write order
};

std::string encode_write_results(const WriteResults& results);
WriteResults decode_write_results(std::string_view bytes, const std::string& origin);

// The final metadata: the skeleton with every slot's offsets, lengths and
// checksums, and every file's size. Throws ProtocolError if a rank reports
// a different number of items than it was assigned or a tensor chunk of a
// different length than planned.
CheckpointMetadata fill_skeleton(const GlobalSavePlan& plan, const std::vector<WriteResults>& results);

}  // namespace distckpt::plan
