// ShardedObject keys and checks, factory expansion, non-persistent wrappers.
#include "distckpt/core/sharded_object.h"

#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/core/state_dict.h"

namespace distckpt {

std::string ShardedObject::unique_key() const {
  return fmt::format("{}/shard_{}_{}", key, fmt::join(global_offset, "."), fmt::join(global_shape, "."));
}

ShardedObject ShardedObject::without_data() const {
  ShardedObject copy = *this;
  copy.data.clear();
  return copy;
}

void ShardedObject::validate_metadata_integrity() const {
  auto fail = [this](const std::string& problem) {
    throw ShardingError(
        fmt::format("ShardedObject '{}': {} (global_shape {}, global_offset {}, "
                    "replica_id {})",
                    key, problem, to_string(global_shape), to_string(global_offset), to_string(replica_id)));
  };
  if (key.empty()) fail("the key is empty; every sharded object needs a checkpoint key");
  if (global_shape.size() != global_offset.size()) {
    fail("global_shape and global_offset have different ranks");
  }
  for (size_t a = 0; a < global_shape.size(); ++a) {
    if (global_offset[a] < 0 || global_offset[a] >= global_shape[a]) {
      fail(fmt::format("on axis {} the shard index {} is outside [0, {})", a, global_offset[a], global_shape[a]));
    }
  }
  if (replica_id.empty()) fail("replica_id is empty; use {0} for the main replica");
  for (int64_t r : replica_id) {
    if (r < 0) fail("replica_id has a negative entry");
  }
}

Value ShardedTensorFactory::build_subtree() const {
  if (!build) {
    throw UsageError(
        fmt::format("ShardedTensorFactory '{}' has no build function; set `build` to "
                    "turn the tensor into sharded entries",
                    key));
  }
  return build(key, data, replica_id, flattened_range);
}

LocalNonPersistentObject::LocalNonPersistentObject(Value v) : value(std::make_shared<Value>(std::move(v))) {}

}  // namespace distckpt
