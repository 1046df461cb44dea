// Local checkpoints with real processes (distckpt-launch): sync and async
// saves, a restart that loads them, a lost file without replication, and a
// lost node (J=2 ranks per node, F=2) recovered bitwise from its peers.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/file.h"
#include "support/process.h"
#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;

const std::string kLauncher = DISTCKPT_BIN_DIR "/distckpt-launch";
const std::string kProbe = DISTCKPT_BIN_DIR "/distckpt_local_probe";

CommandResult probe(int ranks, const std::string& args) {
  return run_command("timeout -s KILL 240 " + kLauncher + " -n " + std::to_string(ranks) + " -- " + kProbe + " " +
                     args + " 2>&1");
}

// Node 1 (ranks 2 and 3, two ranks per node) is replaced by an empty one.
void lose_node_1(const std::string& root) {
  distckpt::io::remove_tree(root + "/rank_2");
  distckpt::io::remove_tree(root + "/rank_3");
}

TEST(LocalCheckpointE2E, SyncAndAsyncSavesLoadAfterARestart) {
  TempDir tmp("local-e2e");
  const std::string replicated = " --ranks-per-node 2 --factor 2";
  ASSERT_EQ(probe(4, tmp.path() + " save 100" + replicated).exit_code, 0);
  const CommandResult async = probe(4, tmp.path() + " save 200 --async" + replicated);
  ASSERT_EQ(async.exit_code, 0) << async.output;
  EXPECT_FALSE(distckpt::io::exists(tmp.path() + "/rank_0/iter_100_owner_0.dcl"));  // cleaned after 200 completed
  const CommandResult load = probe(4, tmp.path() + " load 200" + replicated);
  ASSERT_EQ(load.exit_code, 0) << load.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(load.output, HasSubstr(fmt::format("rank {} loaded iteration 200 bitwise-equal recovered=[]", r)));
  }
}

TEST(LocalCheckpointE2E, LostFileWithoutReplicationLeavesNoCompleteIteration) {
  TempDir tmp("local-e2e-lost");
  ASSERT_EQ(probe(2, tmp.path() + " save 5").exit_code, 0);
  std::remove((tmp.path() + "/rank_1/iter_5_owner_1.dcl").c_str());
  const CommandResult load = probe(2, tmp.path() + " load 5");
  EXPECT_NE(load.exit_code, 0);
  EXPECT_THAT(load.output, HasSubstr("no local checkpoint under"));
  EXPECT_THAT(load.output, HasSubstr("load the global checkpoint instead"));
}

TEST(LocalCheckpointE2E, LostNodeAndCorruptCopyAreRecoveredFromPeers) {
  TempDir tmp("local-e2e-node");
  const std::string replicated = " --ranks-per-node 2 --factor 2";
  // 4 nodes of 2 ranks; cliques {0,2} {1,3} {4,6} {5,7}.
  ASSERT_EQ(probe(8, tmp.path() + " save 7" + replicated).exit_code, 0);
  lose_node_1(tmp.path());
  flip_byte(tmp.path() + "/rank_5/iter_7_owner_5.dcl", 4096 + 100);  // and rank 5's own copy rots
  const CommandResult load = probe(8, tmp.path() + " load 7" + replicated);
  ASSERT_EQ(load.exit_code, 0) << load.output;
  for (int r = 0; r < 8; ++r) {
    EXPECT_THAT(load.output, HasSubstr(fmt::format("rank {} loaded iteration 7 bitwise-equal recovered=[2,3,5]", r)));
  }
  EXPECT_TRUE(distckpt::io::exists(tmp.path() + "/rank_2/iter_7_owner_2.dcl"));  // restored in place
}

TEST(LocalCheckpointE2E, CorruptReplicaIsSkippedForAnother) {
  TempDir tmp("local-e2e-replica");
  // 3 nodes of 2 ranks, F=3: cliques {0,2,4} and {1,3,5}.
  const std::string replicated = " --ranks-per-node 2 --factor 3";
  ASSERT_EQ(probe(6, tmp.path() + " save 9" + replicated).exit_code, 0);
  lose_node_1(tmp.path());
  flip_byte(tmp.path() + "/rank_0/iter_9_owner_2.dcl", 4096 + 100);  // rank 2's first replica
  const CommandResult load = probe(6, tmp.path() + " load 9" + replicated);
  ASSERT_EQ(load.exit_code, 0) << load.output;
  EXPECT_THAT(load.output, HasSubstr("rank 2 recovered iteration 9 from the replica on rank 4"));
  for (int r = 0; r < 6; ++r) {
    EXPECT_THAT(load.output, HasSubstr(fmt::format("rank {} loaded iteration 9 bitwise-equal recovered=[2,3]", r)));
  }
}

TEST(LocalCheckpointE2E, NoIntactReplicaNamesTheRanks) {
  TempDir tmp("local-e2e-none");
  const std::string replicated = " --ranks-per-node 2 --factor 2";
  ASSERT_EQ(probe(4, tmp.path() + " save 8" + replicated).exit_code, 0);
  lose_node_1(tmp.path());
  flip_byte(tmp.path() + "/rank_1/iter_8_owner_3.dcl", 4096 + 100);  // rank 3's only replica
  const CommandResult load = probe(4, tmp.path() + " load 8" + replicated);
  EXPECT_NE(load.exit_code, 0);
  EXPECT_THAT(load.output, HasSubstr("no intact copy of the local checkpoint of rank(s) 3 at iteration 8"));
  EXPECT_THAT(load.output, HasSubstr("fall back to the global checkpoint"));
}

}  // namespace
