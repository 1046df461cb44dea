// What one rank holds, as metadata only: the unit of planning that travels
// between ranks (FlatBuffers, schema/plan.fbs).
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/box.h"
#include "distckpt/core/sharded_object.h"
#include "distckpt/core/sharded_tensor.h"

namespace distckpt::plan {

struct ShardPlan {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  Shape global_shape;
  Box box;  // the non-flat local chunk in global coordinates
  std::optional<FlatRange> flat;
  ReplicaId replica_id{0};
  bool allow_shape_mismatch = false;

  bool is_main() const { return is_main_replica(replica_id); }
  int64_t stored_numel() const { return flat ? flat->size() : box.numel(); }
};

struct ObjectPlan {
  std::string key;
  Shape global_shape;
  Shape global_offset;
  ReplicaId replica_id{0};
  bool is_main() const { return is_main_replica(replica_id); }
  std::string unique_key() const;
};

struct LocalPlan {
  int rank = 0;
  std::vector<ShardPlan> tensors;  // in the order of the rank's sharded tensors
  std::vector<ObjectPlan> objects;
};

ShardPlan plan_of(const ShardedTensor& tensor);
ObjectPlan plan_of(const ShardedObject& object);

std::string encode_local_plan(const LocalPlan& plan);
// Verifies the buffer; `origin` names the sender in messages.
LocalPlan decode_local_plan(std::string_view bytes, const std::string& origin);

}  // namespace distckpt::plan
