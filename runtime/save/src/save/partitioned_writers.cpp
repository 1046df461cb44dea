#include "save/partitioned_writers.h"

#include "comm/agreement.h"

namespace distckpt::saving {

BalancedShare balance_writers(Communicator& comm, const std::string& route_phase, const std::function<void()>& describe,
                              const plan::LocalPlan& local, WriterPolicy policy, bool check_access) {
  const int world = comm.size();
  const std::vector<std::string> routed = all_to_all_agreed(comm, route_phase, [&] {
    describe();
    return plan::route_local_plan(local, world);
  });
  BalancedShare out;
  const std::vector<std::string> to_balance = all_to_all_agreed(comm, "validate the global sharding", [&] {
    out.share = plan::plan_share(routed, policy, check_access);
    return plan::shared_shards_by_balancer(out.share, world);
  });
  out.choices = all_to_all_agreed(comm, "balance the writers", [&] { return plan::balance_shares(to_balance); });
  return out;
}

}  // namespace distckpt::saving
