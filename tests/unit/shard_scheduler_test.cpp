// local/shard_exchange: the scheduler step of the partitioned exchange of
// kept shards, run for W ranks in one process: every need gets one keeper,
// balanced, and both ends of each transfer hold it with one window and tag;
// a need no rank keeps fails naming the rank and the shard; a shard routed
// to the wrong scheduler is refused.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "distckpt/core/errors.h"
#include "local/messages.h"
#include "local/shard_exchange.h"
#include "plan/partitioned_plan.h"
#include "support/throws_with.h"

namespace distckpt::local {
namespace {

constexpr int kWorld = 6;

// Rank r keeps shard "s<k>" when k % 3 == r % 3 (two keepers each) and needs
// every shard of ranks r + 1 and r + 2 it does not keep.
struct Job {
  std::vector<std::vector<std::string>> kept, needed;
};

Job job() {
  Job j{std::vector<std::vector<std::string>>(kWorld), std::vector<std::vector<std::string>>(kWorld)};
  for (int r = 0; r < kWorld; ++r) {
    for (int k = 0; k < 12; ++k) {
      const std::string id = "s" + std::to_string(k);
      if (k % 3 == r % 3) {
        j.kept[static_cast<size_t>(r)].push_back(id);
      } else {
        j.needed[static_cast<size_t>(r)].push_back(id);
      }
    }
  }
  return j;
}

// What every scheduler answers every rank: [scheduler][rank].
std::vector<std::vector<std::string>> schedule(const Job& j) {
  std::vector<std::vector<std::string>> routed(kWorld, std::vector<std::string>(kWorld));  // [scheduler][rank]
  for (int r = 0; r < kWorld; ++r) {
    std::map<int, ShardRouting> parts;
    const auto& needs = j.needed[static_cast<size_t>(r)];
    for (uint32_t i = 0; i < needs.size(); ++i) {
      ShardRouting& p = parts[plan::planner_of(needs[i], kWorld)];
      p.needs.push_back({needs[i], 100});
      p.indices.push_back(i);
    }
    for (const std::string& id : j.kept[static_cast<size_t>(r)]) parts[plan::planner_of(id, kWorld)].kept.push_back(id);
    for (const auto& [s, p] : parts) routed[static_cast<size_t>(s)][static_cast<size_t>(r)] = encode_shard_routing(p);
  }
  std::vector<std::vector<std::string>> answers;
  for (int s = 0; s < kWorld; ++s) answers.push_back(schedule_shard_transfers(routed[static_cast<size_t>(s)], s, 250));
  return answers;
}

TEST(ShardScheduler, EveryNeedGetsOneBalancedKeeperAndBothEndsAgree) {
  const Job j = job();
  const auto answers = schedule(j);
  std::map<std::tuple<uint64_t, uint32_t>, std::vector<std::tuple<int, int>>> ends;  // (window, tag) -> (from, to)
  std::vector<size_t> received(kWorld, 0), sent(kWorld, 0);
  for (int s = 0; s < kWorld; ++s) {
    for (int r = 0; r < kWorld; ++r) {
      const std::string& m = answers[static_cast<size_t>(s)][static_cast<size_t>(r)];
      if (m.empty()) continue;
      const ShardTransferList list = decode_shard_transfers(m, "test");
      for (const auto& x : list.receives) {
        ends[{x.window, x.tag}].emplace_back(x.from, r);
        ++received[static_cast<size_t>(r)];
        EXPECT_EQ(x.bytes, 100u);
        EXPECT_EQ(x.window >> 32, static_cast<uint64_t>(s)) << "windows lead with their scheduler";
        const std::string& id = j.needed[static_cast<size_t>(r)].at(x.need);
        EXPECT_EQ(std::stoi(id.substr(1)) % 3, x.from % 3) << "sent by a keeper of " << id;
      }
      for (const auto& x : list.sends) {
        ends[{x.window, x.tag}].emplace_back(r, x.to);
        ++sent[static_cast<size_t>(r)];
      }
    }
  }
  for (const auto& [key, seen] : ends) {
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0], seen[1]);
  }
  size_t total = 0;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(received[static_cast<size_t>(r)], j.needed[static_cast<size_t>(r)].size());
    total += received[static_cast<size_t>(r)];
  }
  EXPECT_EQ(ends.size(), total);
  // Both keepers of each shard send: the 48 transfers spread over all six ranks.
  for (int r = 0; r < kWorld; ++r) EXPECT_GT(sent[static_cast<size_t>(r)], 0u) << "rank " << r;
}

TEST(ShardScheduler, ANeedNoRankKeepsFailsNamingTheRankAndTheShard) {
  Job j = job();
  j.needed[4].push_back("lost");
  const int s = plan::planner_of("lost", kWorld);
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        std::vector<std::string> routed(kWorld);
        ShardRouting p;
        p.needs.push_back({"lost", 8});
        p.indices.push_back(0);
        routed[4] = encode_shard_routing(p);
        schedule_shard_transfers(routed, s, 250);
      },
      "rank 4 needs lost"));
}

TEST(ShardScheduler, AShardRoutedToAnotherSchedulerIsRefused) {
  const int owner = plan::planner_of("s0", kWorld);
  std::vector<std::string> routed(kWorld);
  ShardRouting p;
  p.kept.push_back("s0");
  routed[1] = encode_shard_routing(p);
  EXPECT_TRUE(throws_with<ProtocolError>([&] { schedule_shard_transfers(routed, (owner + 1) % kWorld, 250); },
                                         "not its scheduler"));
}

// Two transfers under one window and tag would leave one of them unmatched.
TEST(ShardScheduler, AMergeRefusesTwoTransfersUnderOneWindowAndTag) {
  const at::Tensor one = at::empty({4}, at::kFloat);
  const std::vector<KeptShard> kept = {{"k", one}};
  const std::vector<NeededShard> needed = {{"a", "a", one.clone()}, {"b", "b", one.clone()}};
  ShardTransferList list;
  list.receives.push_back({0, 2, 16, uint64_t{1} << 32, 7});
  list.receives.push_back({1, 3, 16, uint64_t{1} << 32, 7});
  std::vector<std::string> answers(4);
  answers[1] = encode_shard_transfers(list);
  EXPECT_TRUE(throws_with<ProtocolError>([&] { merge_shard_transfers(answers, 0, kept, needed, {}); },
                                         "shares its window and tag with another transfer"));
  list.receives.pop_back();
  list.receives.push_back({1, 3, 16, uint64_t{2} << 32, 8});  // in rank 2's windows, sent by rank 1
  answers[1] = encode_shard_transfers(list);
  EXPECT_TRUE(throws_with<ProtocolError>([&] { merge_shard_transfers(answers, 0, kept, needed, {}); },
                                         "another scheduler's window"));
}

}  // namespace
}  // namespace distckpt::local
