// ShardedObject, ShardedTensorFactory and LocalNonPersistentObject: the other
// leaves a sharded state dict may hold (Megatron-Core semantics).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "distckpt/core/box.h"
#include "distckpt/core/sharded_tensor.h"

namespace distckpt {

class Value;

// An opaque per-rank (or per-group) object, e.g. RNG state or an extra_state
// blob. Its position is counted in shards: global_shape = number of shards
// along each axis, global_offset = this shard's index.
struct ShardedObject {
  std::string key;
  std::string data;  // raw bytes; serialise structured objects yourself
  Shape global_shape;
  Shape global_offset;
  ReplicaId replica_id{0};

  // key + "/shard_" + offsets joined by '.' + "_" + shape joined by '.'
  std::string unique_key() const;
  bool is_main_replica() const { return distckpt::is_main_replica(replica_id); }
  ShardedObject without_data() const;
  void validate_metadata_integrity() const;
};

// A tensor stored as something else: `build` turns it into a sub-tree of
// ShardedTensors/Objects before save (and to describe what to load); `merge`
// turns the loaded sub-tree back into one tensor after load.
struct ShardedTensorFactory {
  using BuildFn = std::function<Value(const std::string& key, const at::Tensor& data, const ReplicaId& replica_id,
                                      const std::optional<FlatRange>& flattened_range)>;
  using MergeFn = std::function<at::Tensor(const Value& loaded_subtree)>;

  std::string key;
  at::Tensor data;
  BuildFn build;
  MergeFn merge;
  ReplicaId replica_id{0};
  std::optional<FlatRange> flattened_range;

  Value build_subtree() const;
};

// Not saved; on load, the value from the requested state dict is put back in
// place (e.g. a runtime-only handle or a value recomputed from the config).
struct LocalNonPersistentObject {
  std::shared_ptr<Value> value;
  explicit LocalNonPersistentObject(Value v);
  const Value& unwrap() const { return *value; }
};

}  // namespace distckpt
