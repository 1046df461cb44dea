#include "api/state_dict_split.h"

#include <fmt/format.h>

#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"

namespace distckpt::api {

Value apply_factories(const Value& sharded_state_dict) {
  return map_outplace(sharded_state_dict, [](const Value& leaf) {
    return leaf.kind() == Kind::kFactory ? leaf.as_factory().build_subtree() : leaf;
  });
}

void apply_factory_merges(Value& loaded, const Value& request) {
  if (request.kind() == Kind::kFactory) {
    const ShardedTensorFactory& factory = request.as_factory();
    at::Tensor merged = factory.merge(loaded);
    // Into the caller's tensor when it has one: the merged temporary dies
    // here, so a load holds at most one extra fused tensor at a time.
    if (factory.data.defined() && factory.data.sizes() == merged.sizes()) {
      at::NoGradGuard no_grad;
      factory.data.copy_(merged);
      merged = factory.data;
    }
    loaded = Value(merged);
    return;
  }
  if (request.is_dict() && loaded.is_dict()) {
    for (const auto& [key, child] : request.as_dict()) {
      if (loaded.contains(key)) apply_factory_merges(loaded.at(key), child);
    }
  } else if (request.is_list() && loaded.is_list()) {
    const size_t n = std::min(request.size(), loaded.size());
    for (size_t i = 0; i < n; ++i) apply_factory_merges(loaded[i], request[i]);
  }
}

SplitStateDict split_state_dict(const Value& state_dict) {
  SplitStateDict out;
  auto [sharded, common] = extract_matching(state_dict, [](const Value& v) { return v.is_sharded(); });
  auto [non_persistent, rest] =
      extract_matching(sharded, [](const Value& v) { return v.kind() == Kind::kNonPersistent; });
  for (const Value* leaf : nested_values(rest)) {
    if (leaf->kind() == Kind::kFactory) {
      throw Error(fmt::format("factory '{}' was not applied before splitting the state dict", leaf->as_factory().key));
    }
  }
  out.sharded = std::move(rest);
  out.common = std::move(common);
  out.non_persistent = std::move(non_persistent);
  return out;
}

std::vector<Value*> sharded_leaves(Value& sharded) { return nested_values(sharded); }

Value unwrap_non_persistent(const Value& non_persistent) {
  return map_outplace(non_persistent, [](const Value& leaf) {
    return leaf.kind() == Kind::kNonPersistent ? leaf.as_non_persistent().unwrap() : leaf;
  });
}

}  // namespace distckpt::api
