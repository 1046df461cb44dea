// apply_factories / apply_factory_merges: factories out before save, back in after load.
#include "distckpt/core/factories.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

bool holds_factory(const Value& x) {
  if (x.kind() == Kind::kFactory) return true;
  if (x.is_dict()) {
    for (const auto& [key, child] : x.as_dict()) {
      if (holds_factory(child)) return true;
    }
  } else if (x.is_list()) {
    for (const Value& child : x.as_list()) {
      if (holds_factory(child)) return true;
    }
  }
  return false;
}

void merge_factory(Value& loaded, const ShardedTensorFactory& factory) {
  at::Tensor merged = factory.merge(loaded);
  // Into the caller's tensor when it has one: the merged temporary dies
  // here, so a load holds at most one extra fused tensor at a time.
  if (factory.data.defined() && factory.data.sizes() == merged.sizes()) {
    at::NoGradGuard no_grad;
    factory.data.copy_(merged);
    merged = factory.data;
  }
  loaded = Value(merged);
}

// Walks `factories` over `loaded`; merges only when `apply` (the first walk
// only checks, so an error leaves `loaded` as it was).
struct MergeWalk {
  bool skip_absent;
  bool apply;
};

void merge_at(Value& loaded, const Value& factories, Path& path, MergeWalk walk);

// One child of a container: `slot` is null when `loaded` lacks it.
void merge_child(Value* slot, const Value& request, Path& path, MergeWalk walk) {
  if (!holds_factory(request)) return;
  if (!slot) {
    if (walk.skip_absent) return;
    throw UsageError(
        fmt::format("apply_factory_merges: the loaded state dict has nothing at '{}', where the request has "
                    "a factory; load it (or drop the factory from the request)",
                    to_string(path)));
  }
  merge_at(*slot, request, path, walk);
}

void merge_at(Value& loaded, const Value& factories, Path& path, MergeWalk walk) {
  if (factories.kind() == Kind::kFactory) {
    if (walk.apply) merge_factory(loaded, factories.as_factory());
    return;
  }
  if (factories.is_dict() && loaded.is_dict()) {
    for (const auto& [key, child] : factories.as_dict()) {
      path.push_back(key);
      Dict& d = loaded.as_dict();
      auto it = d.find(key);
      merge_child(it == d.end() ? nullptr : &it->second, child, path, walk);
      path.pop_back();
    }
  } else if (factories.is_list() && loaded.is_list()) {
    // A lenient load that skipped list elements compacts the list: positions
    // no longer match, so nothing in it can be merged by position.
    if (factories.size() != loaded.size() && walk.skip_absent) return;
    if (factories.size() != loaded.size()) {
      throw UsageError(
          fmt::format("apply_factory_merges: lists at '{}' have different lengths ({} loaded, {} requested)",
                      to_string(path), loaded.size(), factories.size()));
    }
    for (size_t i = 0; i < factories.size(); ++i) {
      path.push_back(std::to_string(i));
      merge_child(&loaded[i], factories[i], path, walk);
      path.pop_back();
    }
  } else if (factories.is_dict() && loaded.is_list()) {
    // A list split with lists_as_dicts keeps its positions as keys.
    for (const auto& [key, child] : factories.as_dict()) {
      path.push_back(key);
      const bool index = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
      if (!index || std::stoull(key) >= loaded.size()) {
        throw UsageError(fmt::format("apply_factory_merges: '{}' is not an index of the loaded list of {} elements",
                                     to_string(path), loaded.size()));
      }
      merge_child(&loaded[std::stoull(key)], child, path, walk);
      path.pop_back();
    }
  } else if (holds_factory(factories)) {
    throw UsageError(
        fmt::format("apply_factory_merges: at '{}' the loaded state dict holds a {} where the request holds a {}",
                    to_string(path), kind_name(loaded.kind()), kind_name(factories.kind())));
  }
}

}  // namespace

Value apply_factories(const Value& sharded_state_dict) {
  return map_outplace(sharded_state_dict, [](const Value& leaf) {
    return leaf.kind() == Kind::kFactory ? leaf.as_factory().build_subtree() : leaf;
  });
}

void apply_factory_merges(Value& loaded, const Value& factories, bool skip_absent) {
  Path path;
  merge_at(loaded, factories, path, MergeWalk{skip_absent, /*apply=*/false});
  merge_at(loaded, factories, path, MergeWalk{skip_absent, /*apply=*/true});
}

}  // namespace distckpt
