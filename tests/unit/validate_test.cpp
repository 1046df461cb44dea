// plan/validate: the global save plan checked before any byte is written.
// Pure function of the ranks' local plans, so tested without ranks.
#include "plan/validate.h"

#include <gtest/gtest.h>

#include <vector>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt::plan {
namespace {

ShardPlan shard(const std::string& key, Shape shape, Box box, ReplicaId replica = {0}) {
  ShardPlan s;
  s.key = key;
  s.global_shape = std::move(shape);
  s.box = std::move(box);
  s.replica_id = std::move(replica);
  return s;
}

LocalPlan rank_plan(int rank, std::vector<ShardPlan> tensors, std::vector<ObjectPlan> objects = {}) {
  LocalPlan p;
  p.rank = rank;
  p.tensors = std::move(tensors);
  p.objects = std::move(objects);
  return p;
}

ObjectPlan object(const std::string& key, ReplicaId replica) {
  ObjectPlan o;
  o.key = key;
  o.replica_id = std::move(replica);
  return o;
}

// Two ranks split [8] in halves; rank 2 holds a replica of rank 0's half.
std::vector<LocalPlan> halves() {
  return {rank_plan(0, {shard("w", {8}, Box{{0}, {4}})}), rank_plan(1, {shard("w", {8}, Box{{4}, {4}})}),
          rank_plan(2, {shard("w", {8}, Box{{0}, {4}}, {1})})};
}

TEST(ValidatePlan, ShardedAndReplicatedTensorsPass) { EXPECT_NO_THROW(validate_global_plan(halves())); }

TEST(ValidatePlan, DisagreeingDtypeOrShapeNamesBothRanks) {
  auto plans = halves();
  plans[1].tensors[0].dtype = at::kHalf;
  EXPECT_TRUE(throws_with<ShardingError>([&] { validate_global_plan(plans); }, "on rank 0 but float16 on rank 1"));
  plans = halves();
  plans[2].tensors[0].global_shape = {9};
  EXPECT_TRUE(throws_with<ShardingError>([&] { validate_global_plan(plans); }, "[9] on rank 2"));
}

TEST(ValidatePlan, TwoMainReplicasOfOneShardOverlap) {
  auto plans = halves();
  plans[2].tensors[0].replica_id = {0};
  EXPECT_TRUE(throws_with<ShardingError>([&] { validate_global_plan(plans); }, "main replicas overlap"));
}

TEST(ValidatePlan, FlatRangesMustTileTheirChunk) {
  auto flat = [](int rank, int64_t start, int64_t stop) {
    ShardPlan s = shard("opt.w", {2, 4}, Box{{0, 0}, {2, 4}});
    s.flat = FlatRange{start, stop};
    return rank_plan(rank, {s});
  };
  EXPECT_NO_THROW(validate_global_plan({flat(0, 0, 3), flat(1, 3, 8)}));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        validate_global_plan({flat(0, 0, 4), flat(1, 3, 8)});
      },
      "flattened ranges [0, 4) on rank 0 and [3, 8) on rank 1 overlap"));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        validate_global_plan({flat(0, 0, 3), flat(1, 4, 8)});
      },
      "flattened range [3, 4) of the chunk"));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        validate_global_plan({flat(0, 0, 3), flat(1, 3, 7)});
      },
      "flattened range [7, 8) of the chunk"));
}

TEST(ValidatePlan, ObjectsNeedExactlyOneMainReplica) {
  EXPECT_NO_THROW(
      validate_global_plan({rank_plan(0, {}, {object("rng", {0})}), rank_plan(1, {}, {object("rng", {1})})}));
  EXPECT_TRUE(throws_with<ShardingError>(
      [] {
        validate_global_plan({rank_plan(0, {}, {object("rng", {0})}), rank_plan(1, {}, {object("rng", {0})})});
      },
      "has a main replica on rank 0 and on rank 1"));
  EXPECT_TRUE(throws_with<ShardingError>(
      [] {
        validate_global_plan({rank_plan(0, {}, {object("rng", {1})}), rank_plan(1, {}, {object("rng", {2})})});
      },
      "has no main replica"));
}

}  // namespace
}  // namespace distckpt::plan
