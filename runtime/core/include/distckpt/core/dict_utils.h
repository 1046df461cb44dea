// Tree utilities for state dicts (Megatron-Core dict_utils + prefix helpers).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/state_dict.h"

namespace distckpt {

// Path to a node: dict keys, and list indices written in decimal.
using Path = std::vector<std::string>;
std::string to_string(const Path& path);  // "a/b/0/c"

struct DiffResult {
  std::vector<Path> only_left;   // present in left only
  std::vector<Path> only_right;  // present in right only
  std::vector<Path> mismatch;    // present in both, different kind or value
};
DiffResult diff(const Value& left, const Value& right);

// Splits `x` into (matching, non-matching) leaves, keeping the tree shape.
// Containers left empty are dropped. With lists_as_dicts, lists become dicts
// keyed by index so positions survive the split.
std::pair<Value, Value> extract_matching(const Value& x, const std::function<bool(const Value&)>& predicate,
                                         bool lists_as_dicts = false);

// Merges `src` into `dst` in place: dicts key by key (recursively), lists
// element by element (same length required); a leaf in both is an error.
void merge(Value& dst, const Value& src);

// Applies f to every leaf: in place, or returning a new tree.
void map_inplace(Value& x, const std::function<void(Value&)>& f);
Value map_outplace(const Value& x, const std::function<Value(const Value&)>& f);

// Every leaf (non-container value), depth first, in key order.
std::vector<const Value*> nested_values(const Value& x);
std::vector<Value*> nested_values(Value& x);
// Leaves with their paths.
std::vector<std::pair<Path, const Value*>> nested_items(const Value& x);

// Sharding-key prefix helpers: rewrite the key of every ShardedTensor,
// ShardedObject and ShardedTensorFactory (not the dict keys).
void add_prefix_for_sharding(Value& sharded_state_dict, const std::string& prefix);
// Replaces `old_prefix` by `new_prefix`; every sharded key must start with old_prefix.
void replace_prefix_for_sharding(Value& sharded_state_dict, const std::string& old_prefix,
                                 const std::string& new_prefix);
// For each key, the first (old -> new) pair whose old prefix matches is applied;
// keys matching none stay as they are.
void apply_prefix_mapping(Value& sharded_state_dict,
                          const std::vector<std::pair<std::string, std::string>>& prefix_map);

}  // namespace distckpt
