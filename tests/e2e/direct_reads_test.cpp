// Direct reads within a host (TransferOptions::direct_reads): two real
// processes of one job on this host, each receiving the other's rows of
// "w" straight out of the other's memory. Where a rank cannot read its
// peer (strace fails its process_vm_readv calls with EPERM, as Yama's
// ptrace scope 2 or a container's seccomp would), the host's ranks fall
// back to shared memory, alike; where a read fails after that check, every
// rank fails with the same error class.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "support/fault_jobs.h"
#include "support/ranks.h"

namespace {

// Rank `rank`'s line: its rows arrived bitwise-equal, `direct` ("all" or
// "none") of their bytes read out of the other rank's memory.
void expect_received(const std::string& output, int rank, const std::string& direct) {
  const std::regex line("rank " + std::to_string(rank) +
                        " transferred seed 5 bitwise-equal, ([0-9]+) of ([0-9]+) bytes read directly");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, line)) << output;
  EXPECT_GT(std::stoull(m[2]), 0u) << output;
  EXPECT_EQ(m[1].str(), direct == "all" ? m[2].str() : "0") << output;
}

// Rank 1 runs under strace, its process_vm_readv calls tampered with.
std::string tamper_rank1(const std::string& tamper) {
  return on_rank(1,
                 strace_command() + " -qq -o /dev/null -e trace=process_vm_readv -e inject=process_vm_readv:" + tamper);
}

TEST(DirectReads, RanksOfAHostReadEachOthersSourcesOutOfTheirMemory) {
  TempDir temp("direct-reads");
  const CommandResult r = run_bounded(probe_job(temp.path(), "host-transfer", 5));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_received(r.output, 0, "all");
  expect_received(r.output, 1, "all");
}

TEST(DirectReads, WhereARankCannotReadItsPeerTheHostFallsBackToSharedMemory) {
  if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
  TempDir temp("direct-reads");
  const CommandResult r = run_bounded(probe_job(temp.path(), "host-transfer", 5, "", tamper_rank1("error=EPERM")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_received(r.output, 0, "none");  // rank 1's check failed: neither reads the other's memory
  expect_received(r.output, 1, "none");
  record_fault("transfer within a host, rank 1's process_vm_readv failing (EPERM) from its first call",
               "both ranks fall back to shared memory, values bitwise-equal");
}

TEST(DirectReads, AReadFailingAfterTheCheckFailsEveryRankWithOneErrorClass) {
  if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
  TempDir temp("direct-reads");
  // Rank 1's first call checks that it can read rank 0; its second reads rank 0's rows.
  const CommandResult r =
      run_bounded(probe_job(temp.path(), "host-transfer", 5, "", tamper_rank1("error=ESRCH:when=2")));
  ASSERT_FALSE(ran_out(r)) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr("is gone")) << r.output;  // rank 1 names the cause
  const std::vector<std::string> classes = failure_classes(r.output, 2);
  EXPECT_EQ(classes, (std::vector<std::string>{"CommError", "CommError"})) << r.output;
  record_fault("transfer within a host, rank 1's read of rank 0's memory failing (ESRCH) after the check",
               describe_classes(classes));
}

}  // namespace
