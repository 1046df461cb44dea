// plan/global_plan: who writes each stored shard, the metadata skeleton and
// its slots, and filling it from write results. Plans are built by hand (no
// communication), so the exact assignments can be asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "distckpt/core/errors.h"
#include "plan/global_plan.h"
#include "support/throws_with.h"

namespace distckpt::plan {
namespace {

// Rank = dp * 2 + tp. Tensors split on rows over tp, replicated over dp
// (replica id = dp): d [16, 4] (128-byte chunks), a [8, 4] (64), b [4, 4]
// (32), c [2, 4] (16); e [4] replicated over every rank (16 bytes).
std::vector<LocalPlan> tp2_dp4_plans() {
  std::vector<LocalPlan> plans(8);
  for (int rank = 0; rank < 8; ++rank) {
    const int tp = rank % 2, dp = rank / 2;
    LocalPlan& p = plans[static_cast<size_t>(rank)];
    p.rank = rank;
    for (const auto& [key, rows] :
         std::vector<std::pair<std::string, int64_t>>{{"a", 8}, {"b", 4}, {"c", 2}, {"d", 16}}) {
      ShardPlan s;
      s.key = key;
      s.global_shape = {rows, 4};
      s.box = Box{{tp * rows / 2, 0}, {rows / 2, 4}};
      s.replica_id = {dp};
      p.tensors.push_back(s);
    }
    ShardPlan e;
    e.key = "e";
    e.global_shape = {4};
    e.box = Box{{0}, {4}};
    e.replica_id = {rank};
    p.tensors.push_back(e);
  }
  return plans;
}

// The keys (and tp chunk) a rank writes.
std::vector<std::string> written(const std::vector<LocalPlan>& plans, const std::vector<std::vector<uint32_t>>& a,
                                 int rank) {
  std::vector<std::string> out;
  for (uint32_t i : a[static_cast<size_t>(rank)]) {
    const ShardPlan& s = plans[static_cast<size_t>(rank)].tensors[i];
    out.push_back(s.key + (s.global_shape.size() == 2 ? std::to_string(s.box.offset[0] == 0 ? 0 : 1) : ""));
  }
  return out;
}

// The rank that writes "e" (every rank holds it).
int writer_of_e(const std::vector<LocalPlan>& plans, const std::vector<std::vector<uint32_t>>& a) {
  int found = -1;
  for (int r = 0; r < 8; ++r) {
    const std::vector<std::string> w = written(plans, a, r);
    if (std::count(w.begin(), w.end(), "e") == 1) {
      EXPECT_EQ(found, -1) << "e written twice";
      found = r;
    }
  }
  return found;
}

TEST(WriterDistribution, BalancedTp2Dp4OneChunkPerHolder) {
  const auto plans = tp2_dp4_plans();
  const auto a = distribute_writers(plans, WriterPolicy::kBalanced);
  // The holders of the tp-0 chunks (ranks 0, 2, 4, 6) share d0, a0, b0, c0:
  // largest first to the least loaded, so one each; the tp-1 chunks likewise
  // among 1, 3, 5, 7; e, which all 8 ranks hold, goes to one of them.
  const int e_writer = writer_of_e(plans, a);
  ASSERT_GE(e_writer, 0);
  for (const int tp : {0, 1}) {
    std::multiset<std::string> chunks;
    for (int r = tp; r < 8; r += 2) {
      std::vector<std::string> w = written(plans, a, r);
      w.erase(std::remove(w.begin(), w.end(), "e"), w.end());
      ASSERT_EQ(w.size(), 1u) << "rank " << r;
      chunks.insert(w[0]);
    }
    const std::string t = std::to_string(tp);
    EXPECT_EQ(chunks, (std::multiset<std::string>{"a" + t, "b" + t, "c" + t, "d" + t}));
  }
  const GlobalSavePlan global = make_global_save_plan(plans, WriterPolicy::kBalanced);
  EXPECT_EQ(global.assignments, a);
  std::vector<uint64_t> sorted = global.bytes_per_rank;
  sorted[static_cast<size_t>(e_writer)] -= 16;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<uint64_t>{16, 16, 32, 32, 64, 64, 128, 128}));
}

TEST(WriterDistribution, LowestRankAndMainReplicaPolicies) {
  const auto plans = tp2_dp4_plans();
  const auto lowest = distribute_writers(plans, WriterPolicy::kLowestRank);
  EXPECT_EQ(written(plans, lowest, 0), (std::vector<std::string>{"a0", "b0", "c0", "d0", "e"}));
  EXPECT_EQ(written(plans, lowest, 1), (std::vector<std::string>{"a1", "b1", "c1", "d1"}));
  for (int r = 2; r < 8; ++r) EXPECT_TRUE(lowest[static_cast<size_t>(r)].empty());
  // dp rank 0 holds the main replicas here too, so the result is the same.
  EXPECT_EQ(distribute_writers(plans, WriterPolicy::kMainReplica), lowest);
}

TEST(WriterDistribution, MainReplicaPolicyFollowsTheReplicaIdNotTheRank) {
  auto plans = tp2_dp4_plans();
  for (LocalPlan& p : plans) {
    for (ShardPlan& s : p.tensors) {
      if (s.key != "e") s.replica_id = {(p.rank / 2 + 3) % 4};  // dp rank 1 holds the main copies
    }
  }
  const auto a = distribute_writers(plans, WriterPolicy::kMainReplica);
  EXPECT_EQ(written(plans, a, 2), (std::vector<std::string>{"a0", "b0", "c0", "d0"}));
  EXPECT_EQ(written(plans, a, 3), (std::vector<std::string>{"a1", "b1", "c1", "d1"}));
  EXPECT_EQ(written(plans, a, 0), (std::vector<std::string>{"e"}));
}

TEST(WriterDistribution, DeterministicWhateverTheLocalOrder) {
  const auto plans = tp2_dp4_plans();
  const GlobalSavePlan reference = make_global_save_plan(plans, WriterPolicy::kBalanced);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5; ++trial) {
    auto shuffled = plans;
    for (LocalPlan& p : shuffled) std::shuffle(p.tensors.begin(), p.tensors.end(), rng);
    const GlobalSavePlan g = make_global_save_plan(shuffled, WriterPolicy::kBalanced);
    EXPECT_EQ(g.bytes_per_rank, reference.bytes_per_rank);
    for (int r = 0; r < 8; ++r) {
      std::vector<std::string> x = written(shuffled, g.assignments, r), y = written(plans, reference.assignments, r);
      EXPECT_EQ(x, y) << "rank " << r;  // canonical order: the same list, not just the same set
    }
  }
}

TEST(WriterDistribution, EveryShardWrittenOnceAndBalancedOverManyTensors) {
  // 64 tensors of varied sizes, each replicated over all 4 ranks.
  std::vector<LocalPlan> plans(4);
  uint64_t total = 0;
  for (int r = 0; r < 4; ++r) {
    plans[static_cast<size_t>(r)].rank = r;
    for (int t = 0; t < 64; ++t) {
      ShardPlan s;
      s.key = "t" + std::to_string(t);
      s.global_shape = {(t % 7 + 1) * 100};
      s.box = Box{{0}, s.global_shape};
      s.replica_id = {r};
      plans[static_cast<size_t>(r)].tensors.push_back(s);
      if (r == 0) total += static_cast<uint64_t>(s.global_shape[0]) * 4;
    }
  }
  const GlobalSavePlan g = make_global_save_plan(plans, WriterPolicy::kBalanced);
  size_t items = 0;
  for (const auto& a : g.assignments) items += a.size();
  EXPECT_EQ(items, 64u);
  const auto [lo, hi] = std::minmax_element(g.bytes_per_rank.begin(), g.bytes_per_rank.end());
  uint64_t sum = 0;
  for (uint64_t b : g.bytes_per_rank) sum += b;
  EXPECT_EQ(sum, total);
  EXPECT_LE(*hi - *lo, 2800u);  // at most the largest shard apart
}

TEST(WriterDistribution, SkeletonSlotsFollowCanonicalOrderAndFillFromResults) {
  const auto plans = tp2_dp4_plans();
  GlobalSavePlan g = make_global_save_plan(plans, WriterPolicy::kBalanced);
  g.skeleton.checksum_block_size = 4096;  // one checksum per chunk here
  ASSERT_EQ(g.skeleton.files.size(), 8u);
  EXPECT_EQ(g.skeleton.files[6].path, "data/rank_00006.bin");
  const int w = writer_of_e(plans, g.assignments);
  const auto wi = static_cast<size_t>(w);
  ASSERT_EQ(g.slots[wi].size(), 2u);  // its chunk of a, b, c or d, then e: tensors in key order
  EXPECT_LT(g.skeleton.tensors[g.slots[wi][0].index].key, "e");
  EXPECT_EQ(g.skeleton.tensors[g.slots[wi][1].index].key, "e");

  std::vector<WriteResults> results(8);
  for (int r = 0; r < 8; ++r) {
    results[static_cast<size_t>(r)].rank = r;
    uint64_t at = 0;
    for (const WriteSlot& s : g.slots[static_cast<size_t>(r)]) {
      const uint64_t n = g.skeleton.tensors[s.index].chunks[s.chunk].byte_length;
      results[static_cast<size_t>(r)].items.push_back({at, n, {static_cast<uint64_t>(100 + r)}});
      at += 4096;
    }
    results[static_cast<size_t>(r)].file_size = at;
  }
  const CheckpointMetadata m = fill_skeleton(g, results);
  const TensorRecord* e = m.find_tensor("e");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->chunks[0].byte_offset, 4096u);
  EXPECT_EQ(e->chunks[0].block_checksums, std::vector<uint64_t>{static_cast<uint64_t>(100 + w)});
  EXPECT_EQ(m.files[wi].size, 8192u);

  const int other = w == 3 ? 5 : 3;  // writes one item
  results[static_cast<size_t>(other)].items.pop_back();
  EXPECT_TRUE(throws_with<ProtocolError>([&] { fill_skeleton(g, results); },
                                         "rank " + std::to_string(other) + " reports 0 written items"));
}

TEST(WriterDistribution, WriteResultsRoundTripAndRejectGarbage) {
  WriteResults r{5, 12288, {{0, 100, {1, 2}}, {4096, 7, {3}}}};
  const WriteResults back = decode_write_results(encode_write_results(r), "rank 5");
  EXPECT_EQ(back.rank, 5);
  EXPECT_EQ(back.file_size, 12288u);
  ASSERT_EQ(back.items.size(), 2u);
  EXPECT_EQ(back.items[1].byte_offset, 4096u);
  EXPECT_EQ(back.items[0].block_checksums, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(throws_with<ProtocolError>([] { decode_write_results("not a flatbuffer", "rank 9"); }, "rank 9"));
}

TEST(WriterDistribution, PlanRecoveredFromMetadataMatchesTheOriginal) {
  const auto plans = tp2_dp4_plans();
  GlobalSavePlan g = make_global_save_plan(plans, WriterPolicy::kBalanced);
  const GlobalSavePlan back = global_plan_from_metadata(g.skeleton);
  EXPECT_EQ(back.bytes_per_rank, g.bytes_per_rank);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(local_assignment_from_metadata(g.skeleton, plans[static_cast<size_t>(r)], r),
              g.assignments[static_cast<size_t>(r)])
        << "rank " << r;
    ASSERT_EQ(back.slots[static_cast<size_t>(r)].size(), g.slots[static_cast<size_t>(r)].size());
  }
  auto other = plans[0];
  other.tensors[0].box.length[0] = 3;  // a chunk the checkpoint never had
  EXPECT_TRUE(throws_with<CheckpointError>([&] { local_assignment_from_metadata(g.skeleton, other, 0); },
                                           "saved with another structure"));
}

// Replicas of an object may differ (each data-parallel rank its own RNG
// state under one key): the main replica's is saved under every policy, as
// Megatron saves it, never a balanced or lowest-ranked one.
TEST(WriterDistribution, ObjectsAreWrittenByTheirMainReplicaUnderEveryPolicy) {
  std::vector<LocalPlan> plans = tp2_dp4_plans();
  for (int rank = 0; rank < 8; ++rank) {
    const int tp = rank % 2, dp = rank / 2;
    plans[static_cast<size_t>(rank)].objects.push_back(ObjectPlan{"rng", {2}, {tp}, {3 - dp}, 40});  // main: dp 3
  }
  for (const WriterPolicy policy : {WriterPolicy::kMainReplica, WriterPolicy::kLowestRank, WriterPolicy::kBalanced}) {
    const auto a = distribute_writers(plans, policy);
    for (int rank = 0; rank < 8; ++rank) {
      const size_t object_item = plans[static_cast<size_t>(rank)].tensors.size();
      const auto& mine = a[static_cast<size_t>(rank)];
      EXPECT_EQ(std::count(mine.begin(), mine.end(), object_item), rank >= 6 ? 1 : 0)
          << "rank " << rank << ", policy " << static_cast<int>(policy);
    }
  }
}

// A plan cache seeded from a checkpoint of the earlier planner, which could
// give an object to a replica other than the main one, is not reused.
TEST(WriterDistribution, ASeedWhoseObjectsOtherReplicasWroteIsNotReused) {
  CheckpointMetadata m;
  m.world_size = 4;
  m.files = {{"data/rank_00000.bin", 16, 0}, {"data/rank_00003.bin", 16, 3}};
  m.objects = {{"rng", {2}, {0}, 1, 0, 16, {}}};  // written by rank 3
  LocalPlan main_holder;
  main_holder.rank = 0;
  main_holder.objects.push_back(ObjectPlan{"rng", {2}, {0}, {0}, 16});
  LocalPlan replica = main_holder;
  replica.rank = 3;
  replica.objects[0].replica_id = {1};
  EXPECT_FALSE(objects_written_by_main_replicas(m, main_holder, 0));
  EXPECT_TRUE(objects_written_by_main_replicas(m, replica, 3));
  m.files[1].writer_rank = 0;  // as this planner writes it
  EXPECT_TRUE(objects_written_by_main_replicas(m, main_holder, 0));
}

TEST(WriterDistribution, StructureHashIgnoresObjectSizesAndRank) {
  LocalPlan a = tp2_dp4_plans()[0];
  a.objects.push_back(ObjectPlan{"rng", {8}, {0}, {0}, 100});
  LocalPlan b = a;
  b.rank = 5;
  b.objects[0].byte_size = 200;
  EXPECT_EQ(structure_hash(a), structure_hash(b));
  b.tensors[1].replica_id = {3};
  EXPECT_NE(structure_hash(a), structure_hash(b));
}

}  // namespace
}  // namespace distckpt::plan
