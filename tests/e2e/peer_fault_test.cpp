// Peers that fail from outside, in real processes of a 2-node job (one rank
// per node, each under its own distckpt-launch, so that a rank's death is
// not passed on by a launcher but found by the other rank itself, as on two
// machines): a rank that never starts, and a rank killed (SIGKILL) while its
// background-staged asynchronous save is writing. The other rank fails
// within the timeout, names what happened, and the last committed checkpoint
// keeps its digest.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/fault_jobs.h"
#include "support/ranks.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::SizeIs;

class PeerFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
    ASSERT_GT(port_, 0);
  }

  // Both nodes at once; the output of node 0 first, then node 1's.
  CommandResult both_nodes(const std::string& node0, const std::string& node1) {
    const std::string out1 = dir_ + "/node1.out";
    CommandResult r = run_bounded(
        "env DISTCKPT_TIMEOUT_SECONDS=20 sh -c " +
            shell_quote("(" + node1 + ") >" + shell_quote(out1) + " 2>&1 & " + node0 + "; code=$?; wait; exit $code"),
        90);
    r.output += run_command("cat " + shell_quote(out1)).output;
    return r;
  }

  TempDir temp_{"peer-fault"};
  const std::string dir_ = canonical_path(temp_.path());
  const std::string ckpt_ = dir_ + "/ckpt";
  const int port_ = free_port();
};

// Only node 0 is launched: rank 0 waits for rank 1 no longer than the
// timeout and names it.
TEST_F(PeerFaultTest, ARankThatNeverStartsIsNamedWithinTheTimeout) {
  const CommandResult r = run_bounded("env DISTCKPT_TIMEOUT_SECONDS=2 " + probe_node(0, port_, ckpt_, "save", 1), 60);
  ASSERT_FALSE(ran_out(r)) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(lines_starting(r.output, "rank 0 failed: "),
              ElementsAre(HasSubstr("rank 0 failed: TimeoutError: rank 0 of 2: only 1 of 2 ranks started within the "
                                    "timeout of 2 s; rank(s) 1 never arrived")))
      << r.output;
  EXPECT_THAT(list_dir(dir_), SizeIs(0));  // nothing was created
  record_fault("save, DISTCKPT_TIMEOUT_SECONDS=2: rank 1 never started",
               failure_class(r.output, "rank 0 failed: ") + " on rank 0 naming rank 1");
}

// Rank 1 is killed at its first write of its data file, in the background,
// after its save returned: rank 0's finalize fails, with a communication
// error, long before the timeout; the checkpoint of seed 1 is untouched and
// nothing committed-looking is left; the next save works.
TEST_F(PeerFaultTest, ARankKilledDuringABackgroundStagedSaveFailsTheOthersAtFinalize) {
  const CommandResult first =
      both_nodes(probe_node(0, port_, ckpt_, "save", 1), probe_node(1, port_, ckpt_, "save", 1));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string before = digest(ckpt_);
  ASSERT_THAT(before, HasSubstr("w float32 ")) << before;

  const std::string data1 = dir_ + "/.ckpt.distckpt-staging/data/rank_00001.bin";
  const int port = free_port();
  const CommandResult killed = both_nodes(
      probe_node(0, port, ckpt_, "async-save", 2),
      strace_inject("pwrite64", data1, "signal=SIGKILL:when=1") + " " + probe_node(1, port, ckpt_, "async-save", 2));
  ASSERT_FALSE(ran_out(killed)) << killed.output;
  EXPECT_EQ(killed.exit_code, 1) << killed.output;
  EXPECT_THAT(killed.output, HasSubstr("distckpt-launch: rank 1 was killed by signal 9"));
  const std::vector<std::string> lines = lines_starting(killed.output, "rank 0 failed: ");
  ASSERT_THAT(lines, SizeIs(1)) << killed.output;
  EXPECT_THAT(lines[0], MatchesRegex("rank 0 failed: (CommError|TimeoutError): .*")) << killed.output;
  EXPECT_THAT(killed.output, ::testing::Not(HasSubstr("saved seed 2")));

  EXPECT_THAT(list_dir(dir_), ElementsAre("ckpt", "node1.out"));
  EXPECT_EQ(digest(ckpt_), before);
  record_fault("async-save (background staging) of 2 ranks on 2 nodes: rank 1 SIGKILLed at its first data write",
               failure_class(killed.output, "rank 0 failed: ") + " on rank 0 at finalize; previous checkpoint " +
                   (digest(ckpt_) == before ? "kept" : "CHANGED"));

  const int again = free_port();
  const CommandResult next = both_nodes(probe_node(0, again, ckpt_, "save", 3), probe_node(1, again, ckpt_, "save", 3));
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_NE(digest(ckpt_), before);
}

}  // namespace
