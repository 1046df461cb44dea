// Save planning without a central bottleneck: every rank plans a share, and
// no rank ever holds all ranks' plans. The steps, each a pure function of the
// messages of the step before (the api layer moves them in all-to-alls):
//
//   route     every rank sends each item to the planner of its key
//             (planner_of: a hash of the key, modulo the world)
//   plan      a planner validates its keys (dtype, shape, cover, objects),
//             groups replicas into stored shards, decides every shard one
//             rank holds, and sends the others to the balancer of their
//             holder set (a hash of the set, modulo the world)
//   balance   a balancer balances each of its holder sets
//             (balance_within_holder_sets) and answers the planners
//   decide    a planner tells each rank which of its items it writes, and
//             the coordinator the metadata records of its keys
//   assemble  a rank merges its items; the coordinator merges the records
//             into the metadata skeleton
//
// The outcome equals make_global_save_plan's for the same plans. A rank holds
// its own plan, the items of the keys it plans, the shards of the holder sets
// it balances, and on the coordinator the records of the written chunks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "distckpt/plan/writer_policy.h"
#include "plan/global_plan.h"
#include "plan/local_plan.h"
#include "plan/shard_groups.h"

namespace distckpt::plan {

int planner_of(std::string_view key, int world);
// The balancer rank of a set of holder ranks.
int balancer_of(const std::vector<int>& holders, int world);

// route: part p is what planner p gets of `plan` ("" when nothing).
std::vector<std::string> route_local_plan(const LocalPlan& plan, int world);

// What a planner keeps between its steps.
struct PlannerShare {
  std::vector<LocalPlan> plans;              // the items routed here, one plan per sending rank
  std::vector<std::vector<uint32_t>> items;  // each routed item's index in its sender's whole plan
  Grouping grouping;
  std::vector<int64_t> writer;  // per group (shard_groups.h); kShared until decided
};

// plan: `received[r]` is what rank r routed here. Throws ShardingError for an
// invalid sharding of a key planned here, ProtocolError for malformed parts.
PlannerShare plan_share(const std::vector<std::string>& received, WriterPolicy policy, bool check_access);
// The shards left to balance, part b for balancer b.
std::vector<std::string> shared_shards_by_balancer(const PlannerShare& share, int world);

// balance: `received[p]` is what planner p sent; the answer, part p for planner p.
std::vector<std::string> balance_shares(const std::vector<std::string>& received);

// decide, first half: the balancers' writers into `share.writer`
// (`choices[b]` is balancer b's answer).
void apply_writer_choices(PlannerShare& share, const std::vector<std::string>& choices);
// decide: apply_writer_choices, then the decisions, part r for rank r. The
// coordinator also gets the metadata records of the planner's keys; with
// `coordinator` -1 nobody does (a decision on writers only).
std::vector<std::string> decide_share(PlannerShare& share, const std::vector<std::string>& choices, int world,
                                      int coordinator);

// assemble: the items of `plan` this rank writes, in canonical order.
std::vector<uint32_t> assignment_from_decisions(const std::vector<std::string>& decisions, const LocalPlan& plan);
// assemble, on the coordinator: the skeleton, files and slots (assignments empty).
GlobalSavePlan global_plan_from_decisions(const std::vector<std::string>& decisions, int world);

// The messages of the steps (schema/wire.fbs); decoders raise ProtocolError.
std::string encode_shared_shards(const std::vector<SharedShard>& shards);
std::vector<SharedShard> decode_shared_shards(std::string_view bytes, const std::string& origin);

struct WriterChoices {
  std::vector<uint32_t> ids;  // the planner's shard ids
  std::vector<int> writers;   // the rank chosen for each
};
std::string encode_writer_choices(const WriterChoices& choices);
WriterChoices decode_writer_choices(std::string_view bytes, const std::string& origin);

struct PlanDecision {
  std::vector<uint32_t> items;  // of the receiving rank's plan, that it writes
  PlannedRecords records;       // for the coordinator: the planner's keys
};
std::string encode_plan_decision(const PlanDecision& decision);
PlanDecision decode_plan_decision(std::string_view bytes, const std::string& origin);

}  // namespace distckpt::plan
