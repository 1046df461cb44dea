#include "core/state_dict_split.h"

#include <fmt/format.h>

#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"

namespace distckpt {

SplitStateDict split_state_dict(const Value& state_dict) {
  SplitStateDict out;
  if (state_dict.is_none()) {  // a rank with nothing to save or load (StateDict{})
    out.sharded = out.common = out.non_persistent = Value::dict();
    return out;
  }
  if (!state_dict.is_container()) {
    throw UsageError(fmt::format("a state dict is a dict (or list), not a {}", kind_name(state_dict.kind())));
  }
  auto [sharded, common] = extract_matching(state_dict, [](const Value& v) { return v.is_sharded(); });
  auto [non_persistent, rest] =
      extract_matching(sharded, [](const Value& v) { return v.kind() == Kind::kNonPersistent; });
  for (const Value* leaf : nested_values(rest)) {
    if (leaf->kind() == Kind::kFactory) {
      throw UsageError(
          fmt::format("factory '{}' was not applied before splitting the state dict", leaf->as_factory().key));
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

}  // namespace distckpt
