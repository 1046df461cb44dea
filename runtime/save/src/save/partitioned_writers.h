// The collective part of partitioned planning (plan/partitioned_plan.h) that
// save(), dry_run_save() and a tensor-aware state dict's fully parallel
// distribution share: route every rank's plan to its planners, validate the
// global sharding, balance the shared shards. Each step is an all-to-all
// that carries its errors, so no rank ever holds every rank's plan.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/plan/writer_policy.h"
#include "plan/local_plan.h"
#include "plan/partitioned_plan.h"

namespace distckpt::saving {

struct BalancedShare {
  plan::PlannerShare share;          // the keys this rank plans
  std::vector<std::string> choices;  // the balancers' writers for them (decide_share / apply_writer_choices)
};

// Collective. `describe` runs first, inside the routing step's agreement,
// and fills `local` (this rank's plan), which is then routed.
BalancedShare balance_writers(Communicator& comm, const std::string& route_phase, const std::function<void()>& describe,
                              const plan::LocalPlan& local, WriterPolicy policy, bool check_access);

}  // namespace distckpt::saving
