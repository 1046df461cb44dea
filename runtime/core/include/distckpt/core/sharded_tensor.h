// ShardedTensor: one rank's piece of a global tensor, with the meaning of
// Megatron-Core's dist_checkpointing.ShardedTensor.
#pragma once

#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/core/box.h"

namespace distckpt {

// Which copy of a replicated piece this is. One entry (an int) or several (a
// tuple, e.g. one per replicating mesh axis). All zeros = the main replica,
// the one that is written.
// A distinct type (not an alias of Shape = std::vector<int64_t>) so that
// to_string(ReplicaId) "(0, 1)" and to_string(Shape) "[0, 1]" are different
// functions; it is used exactly like a vector.
struct ReplicaId : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  ReplicaId() = default;
  ReplicaId(std::vector<int64_t> ids) : std::vector<int64_t>(std::move(ids)) {}
};
bool is_main_replica(const ReplicaId& id);
std::string to_string(const ReplicaId& id);

// (axis, rank offset along that axis, number of fragments along that axis)
// with Megatron's meaning: the global tensor along `axis` is `fragments`
// copies of the local extent and this rank holds number `rank_offset`.
struct RankOffset {
  int64_t axis;
  int64_t rank_offset;
  int64_t fragments;
};

class ShardedTensor {
 public:
  std::string key;
  at::Tensor data;  // may be undefined: metadata only (see without_data)
  at::ScalarType dtype = at::kFloat;
  Shape local_shape;          // shape of the (non-flat) local chunk, prepended axes excluded
  Shape global_shape;         // includes prepended axes
  Shape global_offset;        // includes prepended axes
  Shape axis_fragmentations;  // empty: chunk grid unknown (irregular splits)
  ReplicaId replica_id{0};
  int64_t prepend_axis_num = 0;
  bool allow_shape_mismatch = false;
  std::optional<FlatRange> flattened_range;  // data is this slice of the flattened chunk
  // Where a load allocates this tensor when the request carries no data
  // (a request with data is filled where its data lives).
  at::Device device = at::kCPU;

  // Builds a tensor sharded on a regular grid; checks metadata integrity.
  static ShardedTensor from_rank_offsets(std::string key, at::Tensor data, const std::vector<RankOffset>& rank_offsets,
                                         ReplicaId replica_id = {0}, int64_t prepend_axis_num = 0,
                                         bool allow_shape_mismatch = false);

  // Same, where `data` is the slice `flattened_range` of the flattened local
  // chunk whose shape is `local_shape` (ZeRO-style distributed optimizers).
  static ShardedTensor from_rank_offsets_flat(std::string key, at::Tensor flat_data, Shape local_shape,
                                              const std::vector<RankOffset>& rank_offsets, FlatRange flattened_range,
                                              ReplicaId replica_id = {0}, int64_t prepend_axis_num = 0);

  // Explicit placement: any box, irregular splits allowed (no fragmentations).
  static ShardedTensor from_global_offset(std::string key, at::Tensor data, Shape global_shape, Shape global_offset,
                                          ReplicaId replica_id = {0}, int64_t prepend_axis_num = 0,
                                          bool allow_shape_mismatch = false);

  // Throws ShardingError naming the key and what is inconsistent.
  void validate_metadata_integrity() const;

  // Megatron's narrow: narrows the *local* chunk along local dim `dim` and
  // re-expresses it as a shard of a narrower global tensor (fragments *
  // length). Used to split fused tensors (SwiGLU [W; V], QKV) into parts
  // that reshard independently. For flattened tensors only dim 0 is allowed;
  // the result is empty when the flat range misses the narrowed rows.
  std::vector<ShardedTensor> narrow(int64_t dim, int64_t start, int64_t length) const;

  ShardedTensor without_data() const;

  // Global-coordinate box of the (non-flat) local chunk; prepended axes have length 1.
  Box global_box() const;
  // Chunk index on each axis (global_offset / local extent), for grid layouts.
  Shape local_chunk_offset_in_global() const;
  bool is_main_replica() const { return distckpt::is_main_replica(replica_id); }
  // Elements actually held: the flat range size or the local numel.
  int64_t held_numel() const;

  std::string describe() const;  // for messages: key, shapes, offset, replica

  // Megatron's accessors. For a flat (ZeRO) shard: the coordinates of every
  // held element, one int64 tensor per axis, in the local chunk (prepended
  // axes excluded) or in the global tensor (included). ShardingError without
  // a flattened_range.
  std::vector<at::Tensor> local_coordinates() const;
  std::vector<at::Tensor> global_coordinates() const;
  // Where the local chunk sits in the global tensor: an integer for each
  // prepended axis, then a slice per local axis, so
  // `global.index(st.global_slice())` is the chunk (a view).
  std::vector<at::indexing::TensorIndex> global_slice() const;
  // Chunk length along each axis the fragmentations allow (global shape /
  // fragments); ShardingError when an axis does not divide, unless
  // allow_shape_mismatch.
  Shape max_allowed_chunks() const;
  // Allocates `data` when it is undefined (kept otherwise): the held elements
  // (the flat range only, for a flat shard) in `dtype` on `device`.
  using InitFn = std::function<at::Tensor(at::IntArrayRef shape, const at::TensorOptions& options)>;
  void init_data(at::Device device, const InitFn& init = {});
};

}  // namespace distckpt
