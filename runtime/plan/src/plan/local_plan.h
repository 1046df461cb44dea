// What one rank holds, as metadata only: the unit of planning that travels
// between ranks (FlatBuffers, schema/wire.fbs).
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
  uint64_t byte_size = 0;  // balances writers only: objects may change size between saves
  bool is_main() const { return is_main_replica(replica_id); }
  std::string unique_key() const;
};

struct LocalPlan {
  int rank = 0;
  std::vector<ShardPlan> tensors;  // in the order of the rank's sharded tensors
  std::vector<ObjectPlan> objects;

  // Items are numbered tensors first, then objects: item i < tensors.size()
  // is tensors[i], else objects[i - tensors.size()].
  size_t item_count() const { return tensors.size() + objects.size(); }
  // Bytes item i stores (flat range or box for tensors, byte_size for objects).
  uint64_t item_bytes(size_t item) const;
};

// Hash of what a plan says about the checkpoint's structure: keys, dtypes,
// shapes, boxes, flat ranges, replica ids. Object sizes and the rank are left
// out, so an unchanged model hashes the same on every save.
uint64_t structure_hash(const LocalPlan& plan);

// The order in which a rank writes the items it was assigned: tensors by
// (key, box, flat start), then objects by unique key. The coordinator lays out
// the metadata in the same order, so write results need no identities.
void sort_canonically(const LocalPlan& plan, std::vector<uint32_t>& items);

ShardPlan plan_of(const ShardedTensor& tensor);
ObjectPlan plan_of(const ShardedObject& object);

std::string encode_local_plan(const LocalPlan& plan);
// Verifies the buffer; `origin` names the sender in messages.
LocalPlan decode_local_plan(std::string_view bytes, const std::string& origin);
// A part of a rank's plan (partitioned planning): entry i of `part` (tensors,
// then objects) is item `items[i]` of the rank's whole plan.
std::string encode_plan_part(const LocalPlan& part, const std::vector<uint32_t>& items);
LocalPlan decode_plan_part(std::string_view bytes, const std::string& origin, std::vector<uint32_t>& items);

// Every rank's plan from a gather, by rank (each named "rank R" in messages).
std::vector<LocalPlan> decode_local_plans(const std::vector<std::string>& gathered);

}  // namespace distckpt::plan
