// Applying ShardedTensorFactories (Megatron-Core apply_factories and
// apply_factory_merges): save and load call these; they are public for code
// that prepares or post-processes state dicts itself.
#pragma once

#include "distckpt/core/state_dict.h"

namespace distckpt {

// A copy of the tree with every ShardedTensorFactory replaced by the sub-tree
// its build function makes.
Value apply_factories(const Value& sharded_state_dict);

// After a load: wherever `factories` holds a factory, the sub-tree `loaded`
// holds at the same path is merged back into one tensor (copied into the
// factory's tensor when it has one of that shape). `factories` may be the
// whole request or only the part holding factories; the walk goes only down
// paths that lead to a factory. A path `loaded` lacks, a list of another
// length, or a leaf where a container should be is a UsageError naming the path
// (raised before anything is merged),
// unless `skip_absent`: then a factory whose whole sub-tree is absent (a lenient
// load skipped it as unexpected), or that sits in a list the load shortened,
// is left out.
void apply_factory_merges(Value& loaded, const Value& factories, bool skip_absent = false);

}  // namespace distckpt
