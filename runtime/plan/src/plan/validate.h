// Validation of the global save plan (all ranks' local plans) before any byte
// is written: dtype and global shape agree across ranks, and the main
// replicas of every tensor cover it exactly once (flat ranges included).
#pragma once

#include <vector>

#include "plan/local_plan.h"

namespace distckpt::plan {

// Throws ShardingError with the key, ranks and boxes at fault.
void validate_global_plan(const std::vector<LocalPlan>& plans);

}  // namespace distckpt::plan
