// Tree utilities for state dicts (Megatron-Core dict_utils + prefix helpers).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/state_dict.h"

namespace distckpt {

// Path to a node: dict keys, and list indices written in decimal.
using Path = std::vector<std::string>;
std::string to_string(const Path& path);  // "a/b/0/c"

// A path present in both trees whose values differ, with the two kinds.
struct Mismatch {
  Path path;
  Kind left;
  Kind right;
};
struct DiffResult {
  std::vector<Path> only_left;     // present in left only
  std::vector<Path> only_right;    // present in right only
  std::vector<Mismatch> mismatch;  // present in both, different kind or value
  std::vector<Path> mismatch_paths() const;
};
DiffResult diff(const Value& left, const Value& right);

// One line per leaf, indented by depth: "model:", "  w: tensor", "step: int".
std::string inspect_types(const Value& x);

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

// Megatron's dict_map: recurses into dicts only (a list is a leaf) and
// replaces each leaf by f(leaf), in place; dict_map_with_key passes the
// leaf's own key too.
void dict_map(Value& x, const std::function<Value(const Value&)>& f);
void dict_map_with_key(Value& x, const std::function<Value(const std::string& key, const Value&)>& f);

// Groups `xs` by key_fn, maps each with value_fn and reduces each group's
// values (in input order) with reduce_fn.
template <typename T, typename KeyFn, typename ValueFn, typename ReduceFn>
auto map_reduce(const std::vector<T>& xs, KeyFn key_fn, ValueFn value_fn, ReduceFn reduce_fn) {
  using K = std::decay_t<decltype(key_fn(xs.front()))>;
  using V = std::decay_t<decltype(value_fn(xs.front()))>;
  using R = std::decay_t<decltype(reduce_fn(std::vector<V>{}))>;
  std::map<K, std::vector<V>> groups;
  for (const T& x : xs) groups[key_fn(x)].push_back(value_fn(x));
  std::map<K, R> out;
  for (auto& [key, values] : groups) out.emplace(key, reduce_fn(std::move(values)));
  return out;
}

// Every leaf with the container holding it and its key there (a list index
// in decimal), depth first: `value` may be replaced in place.
void for_each_nested_item(Value& x,
                          const std::function<void(Value& container, const std::string& key, Value& value)>& f);

// Every leaf (non-container value), depth first, in key order.
std::vector<const Value*> nested_values(const Value& x);
std::vector<Value*> nested_values(Value& x);
// Leaves with their paths.
std::vector<std::pair<Path, const Value*>> nested_items(const Value& x);

// Megatron's named splits: (matching, rest) by leaf kind.
std::pair<Value, Value> extract_sharded_tensors(const Value& sharded_state_dict);
std::pair<Value, Value> extract_sharded_tensors_and_factories(const Value& sharded_state_dict);
// ShardedTensors, factories and LocalNonPersistentObjects.
std::pair<Value, Value> extract_sharded_tensors_or_nonpersistent(const Value& sharded_state_dict);
std::pair<Value, Value> extract_nonpersistent(const Value& sharded_state_dict);
// ShardedTensors, ShardedObjects and factories (Megatron's ShardedBase).
std::pair<Value, Value> extract_sharded_base(const Value& sharded_state_dict);

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
