#include "api/access_integrity.h"

#include <fmt/format.h>

#include "comm/agreement.h"
#include "distckpt/core/dict_utils.h"
#include "plan/local_plan.h"
#include "plan/validate.h"

namespace distckpt::api {

void validate_access_integrity(const Value& sharded, Communicator& comm) {
  plan::LocalPlan local;
  local.rank = comm.rank();
  for (const Value* leaf : nested_values(sharded)) {
    if (leaf->kind() == Kind::kShardedTensor) local.tensors.push_back(plan::plan_of(leaf->as_sharded_tensor()));
    if (leaf->kind() == Kind::kShardedObject) local.objects.push_back(plan::plan_of(leaf->as_sharded_object()));
  }
  const std::vector<std::string> plans = comm.gather_bytes(plan::encode_local_plan(local), 0);
  run_agreed(comm, "validate the access integrity of the load request", [&] {
    if (!comm.is_coordinator()) return;
    std::vector<plan::LocalPlan> decoded;
    decoded.reserve(plans.size());
    for (size_t r = 0; r < plans.size(); ++r) {
      decoded.push_back(plan::decode_local_plan(plans[r], fmt::format("rank {}", r)));
    }
    plan::validate_global_plan(decoded);
  });
}

}  // namespace distckpt::api
