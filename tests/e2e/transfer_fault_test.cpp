// A transfer whose source dies: three real processes, one rank per node
// (each under its own distckpt-launch, so that a rank's death is found by
// the others themselves, as on three machines); the middle one is killed
// (SIGKILL, injected by strace at one of its socket writes while the bytes
// move as messages, as between hosts). Both others fail within the
// timeout, with the same error class.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "support/fault_jobs.h"
#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;

constexpr int kTimeoutSeconds = 20;

// Three nodes at once; node 0's exit code, every node's output.
CommandResult three_nodes(const std::string& node0, const std::string& node1, const std::string& node2,
                          const std::string& dir) {
  const std::string out1 = dir + "/node1.out", out2 = dir + "/node2.out";
  CommandResult r = run_bounded("env DISTCKPT_TIMEOUT_SECONDS=" + std::to_string(kTimeoutSeconds) + " sh -c " +
                                    shell_quote("(" + node1 + ") >" + shell_quote(out1) + " 2>&1 & (" + node2 + ") >" +
                                                shell_quote(out2) + " 2>&1 & " + node0 + "; code=$?; wait; exit $code"),
                                120);
  r.output += run_command("cat " + shell_quote(out1) + " " + shell_quote(out2)).output;
  return r;
}

TEST(TransferFault, ASourceKilledWhileBytesMoveFailsEveryOtherRankWithOneErrorClass) {
  if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
  TempDir temp("transfer-fault");
  const std::string dir = temp.path();
  // Unharmed first: the three ranks transfer and check every value.
  int port = free_port();
  const CommandResult ok =
      three_nodes(probe_node(0, port, dir, "transfer", 5, "", 3), probe_node(1, port, dir, "transfer", 5, "", 3),
                  probe_node(2, port, dir, "transfer", 5, "", 3), dir);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(lines_starting(ok.output, "rank ").size(), 3u) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr("rank 1 transferred seed 5 bitwise-equal")) << ok.output;

  // Gloo sends with writev: rank 1's first ~290 carry the rendezvous, the
  // planning collectives and the first windows (where it receives), its
  // ~270 messages of 8 KiB follow.
  port = free_port();
  const std::string kill =
      strace_command() + " -qq -o /dev/null -e trace=writev -e inject=writev:signal=SIGKILL:when=350";
  const auto start = std::chrono::steady_clock::now();
  const CommandResult killed =
      three_nodes(probe_node(0, port, dir, "transfer", 5, "", 3), probe_node(1, port, dir, "transfer", 5, kill, 3),
                  probe_node(2, port, dir, "transfer", 5, "", 3), dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(ran_out(killed)) << killed.output;
  EXPECT_EQ(killed.exit_code, 1) << killed.output;
  EXPECT_LT(seconds, 2.0 * kTimeoutSeconds + 10) << killed.output;  // failed within the timeout, not hung
  EXPECT_TRUE(lines_starting(killed.output, "rank 1 ").empty()) << killed.output;  // killed: it says nothing
  const std::string class0 = failure_class(killed.output, "rank 0 failed: ");
  const std::string class2 = failure_class(killed.output, "rank 2 failed: ");
  EXPECT_EQ(class0, class2) << killed.output;
  EXPECT_TRUE(class0 == "CommError" || class0 == "TimeoutError") << killed.output;
  record_fault(
      "transfer of 3 ranks, rank 1 killed (SIGKILL) at its 350th socket write",
      describe_classes({class0, class2}) + " (ranks 0 and 2) after " + std::to_string(seconds).substr(0, 4) + " s");
}

TEST(TransferFault, ASourceKilledWhileRanksReadOneAnothersMemoryFailsEveryOtherRankWithOneErrorClass) {
  if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
  TempDir temp("transfer-fault");
  const std::string dir = temp.path();
  // Rank 1's first two process_vm_readv calls check that it can read ranks 0 and 2; its third reads rank 2's rows,
  // while rank 0 reads rank 1's.
  const int port = free_port();
  const std::string kill =
      strace_command() + " -qq -o /dev/null -e trace=process_vm_readv -e inject=process_vm_readv:signal=SIGKILL:when=3";
  const auto start = std::chrono::steady_clock::now();
  const CommandResult killed = three_nodes(probe_node(0, port, dir, "host-transfer", 5, "", 3),
                                           probe_node(1, port, dir, "host-transfer", 5, kill, 3),
                                           probe_node(2, port, dir, "host-transfer", 5, "", 3), dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(ran_out(killed)) << killed.output;
  EXPECT_EQ(killed.exit_code, 1) << killed.output;
  EXPECT_LT(seconds, 2.0 * kTimeoutSeconds + 10) << killed.output;
  EXPECT_TRUE(lines_starting(killed.output, "rank 1 ").empty()) << killed.output;
  const std::string class0 = failure_class(killed.output, "rank 0 failed: ");
  const std::string class2 = failure_class(killed.output, "rank 2 failed: ");
  EXPECT_EQ(class0, class2) << killed.output;
  EXPECT_TRUE(class0 == "CommError" || class0 == "TimeoutError") << killed.output;
  record_fault(
      "transfer of 3 ranks on one host, rank 1 killed (SIGKILL) at its first read of another's memory",
      describe_classes({class0, class2}) + " (ranks 0 and 2) after " + std::to_string(seconds).substr(0, 4) + " s");
}

}  // namespace
