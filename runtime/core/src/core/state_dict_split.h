// Preparing a sharded state dict for save/load: factories applied, and the
// tree split into sharded entries, common values and non-persistent values.
#pragma once

#include <vector>

#include "distckpt/core/factories.h"
#include "distckpt/core/state_dict.h"

namespace distckpt {

using distckpt::apply_factories;

struct SplitStateDict {
  Value sharded;         // ShardedTensor / ShardedObject leaves only
  Value common;          // plain values (saved once by the coordinator)
  Value non_persistent;  // LocalNonPersistentObject leaves, unwrapped on load
};
// Expects factories already applied (throws UsageError otherwise).
SplitStateDict split_state_dict(const Value& state_dict);

// Leaves of `sharded`, depth first in key order (same order on every call).
std::vector<Value*> sharded_leaves(Value& sharded);

// Replaces each LocalNonPersistentObject leaf by its wrapped value.
Value unwrap_non_persistent(const Value& non_persistent);

}  // namespace distckpt
