// Comparing two checkpoints and taking one tensor out of one, on one process
// (the `distckpt diff` and `distckpt extract` commands).
#pragma once

#include <string>
#include <vector>

namespace distckpt {

struct TensorDifference {
  enum class Status { kEqual, kOnlyLeft, kOnlyRight, kDtype, kShape, kValues };
  std::string key;
  Status status = Status::kEqual;
  // Where it differs: "float32 vs bfloat16", "[2, 3] vs [3, 2]", or "2 of 6
  // elements differ, first at [0, 2] (3 vs 4), max |difference| 1".
  std::string detail;
};
const char* difference_status_name(TensorDifference::Status status);  // "equal", "only_left", ...

struct CheckpointDiff {
  std::vector<TensorDifference> tensors;  // every tensor key of either, sorted
  // Common state, by key path ("a/b/0").
  std::vector<std::string> common_only_left;
  std::vector<std::string> common_only_right;
  std::vector<std::string> common_differ;
  // Sharded objects. An object saved on the same shard grid on both sides
  // is compared shard by shard, by bytes (unique keys KEY/shard_OFFSET_SHAPE);
  // one saved on another grid (a per-tp object, say, after resharding) is
  // layout-dependent and cannot be compared: "KEY: grid [2] vs [4]".
  std::vector<std::string> objects_only_left;
  std::vector<std::string> objects_only_right;
  std::vector<std::string> objects_differ;
  std::vector<std::string> objects_other_grid;
  bool content_metadata_differs = false;  // SaveOptions::content_metadata
  bool tensors_equal() const;
  bool objects_equal() const;
  // Tensors, common state and content metadata equal; objects as well when
  // `including_objects` (a checkpoint resaved under another layout differs
  // in its layout-dependent objects only).
  bool equal(bool including_objects = true) const;
};

// Tensors are compared by their logical values, whatever layout saved them:
// a streamed digest first, and only tensors whose digests differ are read
// whole (two at a time) to say where.
CheckpointDiff diff_checkpoints(const std::string& left, const std::string& right);

// The tensor `key` of the checkpoint DIR, whole, written to `file`: a
// ".safetensors" file (one tensor named `key`) or a ".pt" file torch.load
// opens ({key: tensor}). `file` must not exist; it appears only when complete.
void extract_tensor(const std::string& dir, const std::string& key, const std::string& file);

}  // namespace distckpt
