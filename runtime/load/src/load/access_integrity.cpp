// One gather of every rank's requested shards, validated as a save's would be.
#include "load/access_integrity.h"

#include "comm/agreement.h"
#include "distckpt/core/dict_utils.h"
#include "plan/local_plan.h"
#include "plan/validate.h"

namespace distckpt::loading {

void validate_access_integrity(const Value& sharded, Communicator& comm) {
  std::string mine;
  run_agreed(comm, "describe the load request", [&] {
    plan::LocalPlan local;
    local.rank = comm.rank();
    for (const Value* leaf : nested_values(sharded)) {
      if (leaf->kind() == Kind::kShardedTensor) local.tensors.push_back(plan::plan_of(leaf->as_sharded_tensor()));
      if (leaf->kind() == Kind::kShardedObject) local.objects.push_back(plan::plan_of(leaf->as_sharded_object()));
    }
    mine = plan::encode_local_plan(local);
  });
  const std::vector<std::string> plans = comm.gather_bytes(mine, 0);
  run_agreed(comm, "validate the access integrity of the load request", [&] {
    if (comm.is_coordinator()) plan::validate_global_plan(plan::decode_local_plans(plans));
  });
}

}  // namespace distckpt::loading
