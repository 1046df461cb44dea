// Validation of the global save plan (all ranks' local plans) before any byte
// is written: dtype and global shape agree across ranks, and the main
// replicas of every tensor cover it exactly once (flat ranges included).
#pragma once

#include <vector>

#include "plan/local_plan.h"

namespace distckpt::plan {

// Throws ShardingError with the key, ranks and boxes at fault. Without
// `check_access`, only dtype and shape agreement is checked (Megatron's
// validate_access_integrity=False): not the main replicas' cover of each
// tensor, nor each object's shards.
void validate_global_plan(const std::vector<LocalPlan>& plans, bool check_access = true);

}  // namespace distckpt::plan
