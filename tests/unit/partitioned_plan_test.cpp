// plan/partitioned_plan: the steps of partitioned save planning, run for W
// ranks in one process with the messages moved by hand, decide exactly what
// the central planner (make_global_save_plan) decides; errors surface at the
// planner of the key at fault; no rank receives more than its share.
#include "plan/partitioned_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "distckpt/core/errors.h"
#include "support/all_to_all.h"
#include "support/throws_with.h"

namespace distckpt::plan {
namespace {

using testing::Messages;
using testing::transpose;

struct Outcome {
  std::vector<std::vector<uint32_t>> assignments;
  GlobalSavePlan global;
  std::vector<size_t> received_bytes;  // per rank, over the four steps
};

// The four all-to-alls of save/save_plan.cpp, by hand.
Outcome plan_partitioned(const std::vector<LocalPlan>& plans, WriterPolicy policy, int coordinator = 0,
                         bool check_access = true) {
  const int world = static_cast<int>(plans.size());
  Outcome out;
  out.received_bytes.assign(plans.size(), 0);
  const auto deliver = [&](const Messages& sent) {
    Messages got = transpose(sent);
    for (size_t r = 0; r < got.size(); ++r) {
      for (const std::string& m : got[r]) out.received_bytes[r] += m.size();
    }
    return got;
  };
  Messages routed(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) routed[r] = route_local_plan(plans[r], world);
  const Messages at_planners = deliver(routed);
  std::vector<PlannerShare> shares(plans.size());
  Messages to_balancers(plans.size());
  for (size_t p = 0; p < plans.size(); ++p) {
    shares[p] = plan_share(at_planners[p], policy, check_access);
    to_balancers[p] = shared_shards_by_balancer(shares[p], world);
  }
  const Messages at_balancers = deliver(to_balancers);
  Messages answers(plans.size());
  for (size_t b = 0; b < plans.size(); ++b) answers[b] = balance_shares(at_balancers[b]);
  const Messages at_planners_again = deliver(answers);
  Messages decisions(plans.size());
  for (size_t p = 0; p < plans.size(); ++p) {
    decisions[p] = decide_share(shares[p], at_planners_again[p], world, coordinator);
  }
  const Messages at_ranks = deliver(decisions);
  for (size_t r = 0; r < plans.size(); ++r) out.assignments.push_back(assignment_from_decisions(at_ranks[r], plans[r]));
  out.global = global_plan_from_decisions(at_ranks[static_cast<size_t>(coordinator)], world);
  return out;
}

// Random layouts: tensors split on rows over tp, replicated over dp (some
// with ZeRO flat ranges over dp instead), a few replicated everywhere, some
// without elements, and objects per tp rank.
std::vector<LocalPlan> random_plans(int tp, int dp, uint32_t seed) {
  std::mt19937 rng(seed);
  const int world = tp * dp;
  std::vector<LocalPlan> plans(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) plans[static_cast<size_t>(r)].rank = r;
  const int tensors = 5 + static_cast<int>(rng() % 20);
  for (int t = 0; t < tensors; ++t) {
    const int kind = static_cast<int>(rng() % 4);
    const int64_t rows = tp * (1 + static_cast<int64_t>(rng() % 5)), cols = 1 + static_cast<int64_t>(rng() % 7);
    for (int r = 0; r < world; ++r) {
      const int t_rank = r % tp, d_rank = r / tp;
      ShardPlan s;
      s.key = "layer" + std::to_string(t) + ".weight";
      s.dtype = t % 3 == 0 ? at::kBFloat16 : at::kFloat;
      s.global_shape = {rows, cols};
      if (kind == 3) {  // replicated on every rank
        s.box = Box{{0, 0}, {rows, cols}};
        s.replica_id = {r};
      } else if (kind == 2 && rows == tp) {  // no elements
        s.global_shape = {0, cols};
        s.box = Box{{0, 0}, {0, cols}};
        s.replica_id = {d_rank};
      } else {
        s.box = Box{{t_rank * rows / tp, 0}, {rows / tp, cols}};
        s.replica_id = {d_rank};
        if (kind == 1) {  // ZeRO: each dp rank a flat range of the tp chunk
          const int64_t n = s.box.numel(), per = (n + dp - 1) / dp;
          s.flat = FlatRange{std::min(n, d_rank * per), std::min(n, (d_rank + 1) * per)};
          s.replica_id = {0};
        }
      }
      plans[static_cast<size_t>(r)].tensors.push_back(s);
    }
  }
  for (int r = 0; r < world; ++r) {
    plans[static_cast<size_t>(r)].objects.push_back(
        ObjectPlan{"rng", {tp}, {r % tp}, {r / tp}, 16 + static_cast<uint64_t>(rng() % 64)});
    std::shuffle(plans[static_cast<size_t>(r)].tensors.begin(), plans[static_cast<size_t>(r)].tensors.end(), rng);
  }
  return plans;
}

void expect_same_plan(const GlobalSavePlan& central, const Outcome& partitioned) {
  EXPECT_EQ(partitioned.assignments, central.assignments);
  EXPECT_EQ(partitioned.global.bytes_per_rank, central.bytes_per_rank);
  const CheckpointMetadata& a = central.skeleton;
  const CheckpointMetadata& b = partitioned.global.skeleton;
  ASSERT_EQ(b.files.size(), a.files.size());
  for (size_t f = 0; f < a.files.size(); ++f) {
    EXPECT_EQ(b.files[f].path, a.files[f].path);
    EXPECT_EQ(b.files[f].writer_rank, a.files[f].writer_rank);
  }
  ASSERT_EQ(b.tensors.size(), a.tensors.size());
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    EXPECT_EQ(b.tensors[t].key, a.tensors[t].key);
    EXPECT_EQ(b.tensors[t].dtype, a.tensors[t].dtype);
    EXPECT_EQ(b.tensors[t].global_shape, a.tensors[t].global_shape);
    ASSERT_EQ(b.tensors[t].chunks.size(), a.tensors[t].chunks.size()) << a.tensors[t].key;
    for (size_t c = 0; c < a.tensors[t].chunks.size(); ++c) {
      const ChunkRecord& x = a.tensors[t].chunks[c];
      const ChunkRecord& y = b.tensors[t].chunks[c];
      EXPECT_TRUE(x.box == y.box && x.flat == y.flat && x.file == y.file && x.byte_length == y.byte_length)
          << a.tensors[t].key << " chunk " << c;
    }
  }
  ASSERT_EQ(b.objects.size(), a.objects.size());
  for (size_t o = 0; o < a.objects.size(); ++o) {
    EXPECT_EQ(b.objects[o].unique_key(), a.objects[o].unique_key());
    EXPECT_EQ(b.objects[o].file, a.objects[o].file);
  }
  const auto& x = central.slots;
  const auto& y = partitioned.global.slots;
  ASSERT_EQ(y.size(), x.size());
  for (size_t r = 0; r < x.size(); ++r) {
    ASSERT_EQ(y[r].size(), x[r].size()) << "rank " << r;
    for (size_t k = 0; k < x[r].size(); ++k) {
      EXPECT_TRUE(y[r][k].is_object == x[r][k].is_object && y[r][k].index == x[r][k].index &&
                  y[r][k].chunk == x[r][k].chunk)
          << "rank " << r << " slot " << k;
    }
  }
}

TEST(PartitionedPlan, DecidesWhatTheCentralPlannerDecides) {
  for (const auto& [tp, dp] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 3}, {2, 4}, {4, 3}, {3, 5}}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const std::vector<LocalPlan> plans = random_plans(tp, dp, seed * 31 + static_cast<uint32_t>(tp * dp));
      for (const WriterPolicy policy :
           {WriterPolicy::kBalanced, WriterPolicy::kLowestRank, WriterPolicy::kMainReplica}) {
        SCOPED_TRACE(::testing::Message()
                     << "tp " << tp << " dp " << dp << " seed " << seed << " policy " << static_cast<int>(policy));
        const GlobalSavePlan central = make_global_save_plan(plans, policy);
        expect_same_plan(central, plan_partitioned(plans, policy, /*coordinator=*/(tp * dp) / 2));
      }
    }
  }
}

TEST(PartitionedPlan, EveryStoredShardIsWrittenOnceAndSetsAreBalanced) {
  const std::vector<LocalPlan> plans = random_plans(2, 4, 7);
  const Outcome o = plan_partitioned(plans, WriterPolicy::kBalanced);
  std::set<std::string> written;
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const uint32_t i : o.assignments[r]) {
      const std::string id = i < plans[r].tensors.size()
                                 ? plans[r].tensors[i].key + to_string(plans[r].tensors[i].box) +
                                       (plans[r].tensors[i].flat ? std::to_string(plans[r].tensors[i].flat->start) : "")
                                 : plans[r].objects[i - plans[r].tensors.size()].unique_key();
      EXPECT_TRUE(written.insert(id).second) << id << " written twice";
    }
  }
  size_t chunks = o.global.skeleton.objects.size();
  for (const TensorRecord& t : o.global.skeleton.tensors) chunks += t.chunks.size();
  EXPECT_EQ(written.size(), chunks);
}

TEST(PartitionedPlan, AnInvalidShardingFailsAtThePlannerOfItsKey) {
  std::vector<LocalPlan> plans = random_plans(2, 2, 3);
  for (LocalPlan& p : plans) {
    for (ShardPlan& s : p.tensors) {
      if (s.key == "layer0.weight") s.replica_id = {0};  // every dp rank claims the main replica
    }
  }
  const int world = static_cast<int>(plans.size());
  const int planner = planner_of("layer0.weight", world);
  Messages routed(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) routed[r] = route_local_plan(plans[r], world);
  const Messages at_planners = transpose(routed);
  for (int p = 0; p < world; ++p) {
    if (p == planner) {
      EXPECT_TRUE(throws_with<ShardingError>(
          [&] { plan_share(at_planners[static_cast<size_t>(p)], WriterPolicy::kBalanced, true); }, "layer0.weight"));
    } else {
      EXPECT_NO_THROW(plan_share(at_planners[static_cast<size_t>(p)], WriterPolicy::kBalanced, true));
    }
  }
}

TEST(PartitionedPlan, ARankReceivesItsShareNotTheWorldsPlans) {
  // 64 ranks (tp 8 x dp 8), 64 keys: each rank plans about one key, so it
  // receives about 1/64 of the descriptors, where the central planner's
  // coordinator receives all of them.
  std::vector<LocalPlan> plans(64);
  for (int r = 0; r < 64; ++r) {
    plans[static_cast<size_t>(r)].rank = r;
    for (int t = 0; t < 64; ++t) {
      ShardPlan s;
      s.key = "decoder.layers." + std::to_string(t) + ".weight";
      s.global_shape = {64, 16};
      s.box = Box{{(r % 8) * 8, 0}, {8, 16}};
      s.replica_id = {r / 8};
      plans[static_cast<size_t>(r)].tensors.push_back(s);
    }
  }
  size_t all_plans = 0;
  for (const LocalPlan& p : plans) all_plans += encode_local_plan(p).size();
  const Outcome o = plan_partitioned(plans, WriterPolicy::kBalanced);
  const size_t busiest = *std::max_element(o.received_bytes.begin(), o.received_bytes.end());
  EXPECT_LT(busiest, all_plans / 8) << "the busiest rank received " << busiest << " of " << all_plans << " bytes";
  // Each dp set of 8 ranks holds 64 chunks of one tp rank: 8 each.
  for (const uint64_t bytes : o.global.bytes_per_rank) EXPECT_EQ(bytes, 8u * 8 * 16 * 4);
}

TEST(PartitionedPlan, MalformedMessagesRaiseProtocolErrorNamingTheSender) {
  EXPECT_TRUE(throws_with<ProtocolError>([] { decode_shared_shards("garbage", "planner 3"); }, "planner 3"));
  EXPECT_TRUE(throws_with<ProtocolError>([] { decode_writer_choices("garbage", "balancer 2"); }, "balancer 2"));
  EXPECT_TRUE(throws_with<ProtocolError>([] { decode_plan_decision("garbage", "planner 1"); }, "planner 1"));
  SharedShard s;
  s.name = "w";
  s.holders = {3, 3};
  EXPECT_TRUE(throws_with<ProtocolError>([&] { decode_shared_shards(encode_shared_shards({s}), "planner 0"); },
                                         "not distinct ascending"));
  EXPECT_TRUE(throws_with<ProtocolError>(
      [] {
        decode_writer_choices(encode_writer_choices({{1, 2}, {0}}), "balancer 0");
      },
      "as many ids"));
  // An item a rank does not have, or the same item from two planners.
  LocalPlan plan;
  plan.tensors.resize(2);
  const std::string one = encode_plan_decision({{1}, {}});
  EXPECT_TRUE(throws_with<ProtocolError>([&] { assignment_from_decisions({one, one}, plan); }, "assigned twice"));
  EXPECT_TRUE(throws_with<ProtocolError>(
      [&] {
        assignment_from_decisions({encode_plan_decision({{2}, {}})}, plan);
      },
      "item 2 of 2"));
  // Two planners claiming one key.
  PlanDecision d;
  d.records.tensors.push_back({"w", at::kFloat, {4}, {{Box{{0}, {4}}, std::nullopt, 0}}});
  const std::string part = encode_plan_decision(d);
  EXPECT_TRUE(throws_with<ProtocolError>([&] { global_plan_from_decisions({part, part}, 2); }, "two planners"));
}

}  // namespace
}  // namespace distckpt::plan
