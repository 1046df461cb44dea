// Faults in local checkpoints, in real 2-rank jobs (distckpt-launch +
// distckpt_local_probe, each rank replicating to the other), injected from
// outside the program with strace. A failed save must fail both ranks naming
// the file and the errno text, leave no file of the failed iteration anywhere and keep the
// previous iteration loadable; a failed read of a rank's own copy is
// recovered from its replica; a job that resumed from an older state never
// loads what the abandoned run saved after that state.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "support/fault_jobs.h"
#include "support/ranks.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

const std::string kBin = DISTCKPT_BIN_DIR;

class LocalFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
  }

  // A 2-rank job of the probe; `rank_prefix` runs before it on every rank
  // (it may look at $RANK), `job_prefix` before the launcher.
  CommandResult job(const std::string& args, const std::string& job_prefix = "",
                    const std::string& rank_prefix = "") const {
    return run_bounded(job_prefix + (job_prefix.empty() ? "" : " ") + kBin + "/distckpt-launch -n 2 -- " + rank_prefix +
                       (rank_prefix.empty() ? "" : " ") + kBin + "/distckpt_local_probe " + shell_quote(root_) + " " +
                       args + " --ranks-per-node 1 --factor 2 2>&1");
  }
  void save(int64_t iteration, int run = 0) const {
    const CommandResult r = job(fmt::format("save {} --run {}", iteration, run));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // Loads the latest complete iteration on both ranks: it must be
  // `iteration`, of `run`, bitwise, with `recovered` ranks restored from replicas.
  void expect_load(int64_t iteration, int run, const std::string& recovered = "") const {
    const CommandResult r = job("load latest");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_THAT(r.output, HasSubstr(fmt::format("rank {} loaded iteration {} bitwise-equal recovered=[{}] run={}\n",
                                                  rank, iteration, recovered, run)));
    }
  }
  // Both ranks' directories hold exactly the complete files of `iteration`.
  void expect_only_iteration(int64_t iteration) const {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_THAT(list_dir(dir(rank)), ElementsAre(fmt::format("iter_{}_owner_0.dcl", iteration),
                                                   fmt::format("iter_{}_owner_1.dcl", iteration)))
          << "rank " << rank;
    }
  }
  std::string dir(int rank) const { return canonical_path(root_) + fmt::format("/rank_{}", rank); }
  std::vector<std::string> complete_files(int rank) const {
    std::vector<std::string> names = list_dir(dir(rank));
    names.erase(std::remove_if(names.begin(), names.end(),
                               [](const std::string& n) { return n.size() > 4 && n.substr(n.size() - 4) == ".tmp"; }),
                names.end());
    return names;
  }
  // Where `holder` keeps `owner`'s file of `iteration` while it is written.
  std::string tmp_file(int holder, int64_t iteration, int owner) const {
    return fmt::format("{}/iter_{}_owner_{}.dcl.tmp", dir(holder), iteration, owner);
  }

  TempDir tmp_{"local-fault"};
  std::string root_ = tmp_.path();
};

struct SaveFault {
  const char* name;
  const char* syscalls;
  int holder, owner;  // the file: `holder`'s copy of `owner`'s checkpoint, being written
  const char* tamper;
  const char* errno_text;
  const char* save_args = "";  // " --async": save_async, the write on a background thread
};

class LocalSaveFaultTest : public LocalFaultTest, public ::testing::WithParamInterface<SaveFault> {};

// Iteration 1 is saved; the save of iteration 2 meets the fault: both ranks
// fail naming the file and the errno text, no file of iteration 2 is left on either rank,
// iteration 1 loads bitwise, and saving iteration 2 again works.
TEST_P(LocalSaveFaultTest, FailsBothRanksAndKeepsThePreviousIteration) {
  const SaveFault& f = GetParam();
  save(1);
  const std::string path = tmp_file(f.holder, 2, f.owner);
  const CommandResult faulty = job(std::string("save 2") + f.save_args, strace_inject(f.syscalls, path, f.tamper));
  EXPECT_EQ(faulty.exit_code, 1) << faulty.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<std::string> lines = lines_starting(faulty.output, fmt::format("rank {}: ", rank));
    ASSERT_THAT(lines, SizeIs(1)) << faulty.output;
    EXPECT_THAT(lines[0], HasSubstr(path));
    EXPECT_THAT(lines[0], HasSubstr(f.errno_text));
  }
  // The same class on both ranks: the faulting one's and the other's.
  EXPECT_THAT(failure_classes(faulty.output, 2, "rank {}: "), ::testing::Each(::testing::Eq("IoError")))
      << faulty.output;
  record_fault(fmt::format("local save of 2 ranks: {} {} on rank {}'s {}", f.syscalls, f.tamper, f.holder,
                           f.holder == f.owner ? "own file" : "replica of rank " + std::to_string(f.owner)),
               describe_classes(failure_classes(faulty.output, 2, "rank {}: ")) + "; iteration 1 kept");
  expect_only_iteration(1);
  expect_load(1, 0);
  save(2);
  expect_only_iteration(2);
  expect_load(2, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, LocalSaveFaultTest,
    ::testing::Values(SaveFault{"DiskFullWritingTheOwnFile", "pwrite64", 1, 1, "error=ENOSPC",
                                "No space left on device"},
                      SaveFault{"EioOnFsyncOfTheOwnFile", "fsync", 0, 0, "error=EIO", "Input/output error"},
                      SaveFault{"EioOnRenameOfTheOwnFile", "rename", 1, 1, "error=EIO", "Input/output error"},
                      SaveFault{"DiskFullWritingAReplica", "pwrite64", 0, 1, "error=ENOSPC", "No space left on device"},
                      SaveFault{"NoPermissionToCreateAReplica", "openat", 1, 0, "error=EACCES", "Permission denied"},
                      SaveFault{"EioOnFsyncOfAReplica", "fsync", 1, 0, "error=EIO", "Input/output error"},
                      SaveFault{"DiskFullWritingTheOwnFileInTheBackground", "pwrite64", 0, 0, "error=ENOSPC",
                                "No space left on device", " --async"}),
    [](const ::testing::TestParamInfo<SaveFault>& info) { return std::string(info.param.name); });

TEST_F(LocalFaultTest, AReadErrorOnTheOwnCopyIsRecoveredFromTheReplica) {
  save(3);
  const std::string own = dir(1) + "/iter_3_owner_1.dcl";
  const CommandResult r = job("load 3", strace_inject("pread64", own, "error=EIO"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 recovered iteration 3 from the replica on rank 0"));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(r.output, HasSubstr(fmt::format("rank {} loaded iteration 3 bitwise-equal recovered=[1] run=0", rank)));
  }
  expect_only_iteration(3);
}

// Run 0 saved iterations 10 and 30; run 1 resumed from iteration 15 (say,
// the global checkpoint) and saves 20, then 30. Iteration 30 of run 0 is
// gone as soon as run 1 saves 20: kept, it would be the latest after a
// restart, and the job would resume into the abandoned run.
TEST_F(LocalFaultTest, ASaveAfterResumingFromAnOlderStateRemovesTheAbandonedIterations) {
  save(10);
  save(30);
  const CommandResult resumed = job("save 20 --run 1");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("local checkpoint: saving iteration 20 removes iteration(s) 30 under"));
  expect_only_iteration(20);
  expect_load(20, 1);
  save(30, /*run=*/1);  // the same iteration as run 0's: no file is in the way
  expect_only_iteration(30);
  expect_load(30, 1);
}

// Run 1 saves iteration 2 where run 0 saved it (replicated on both ranks).
// Rank 1's write fails, and rank 0 is killed right after its own file of run
// 1 is in place, at its second fsync of its directory (the first made the
// removal of run 0's files durable; a synchronous save makes both on the
// calling thread), before it learns of rank 1's failure. Rank 0's file of run 1 must never load
// beside rank 1's of run 0.
TEST_F(LocalFaultTest, AKilledSaveNeverMixesTwoRunsStates) {
  save(1);
  save(2);
  const std::string wrapper = tmp_.file("per_rank.sh");
  std::ofstream(wrapper) << ("if [ \"$RANK\" = 0 ]; then exec " +
                             strace_inject("fsync", dir(0), "signal=SIGKILL:when=2") + " \"$@\"; else exec " +
                             strace_inject("pwrite64", tmp_file(1, 2, 1), "error=EIO") + " \"$@\"; fi\n");
  const CommandResult faulty = job("save 2 --run 1", "", "/bin/sh " + shell_quote(wrapper));
  EXPECT_NE(faulty.exit_code, 0) << faulty.output;
  // The instant sought: rank 0's file of run 1 is complete; rank 1 holds none
  // (a temporary file may remain where rank 1 was stopped before removing it).
  EXPECT_THAT(complete_files(0), ElementsAre("iter_2_owner_0.dcl"));
  EXPECT_THAT(complete_files(1), ElementsAre());
  // Run 0's iteration 2 went before run 1 wrote anything, so no iteration is
  // complete: the job falls back to its global checkpoint.
  const CommandResult load = job("load latest");
  EXPECT_NE(load.exit_code, 0);
  EXPECT_THAT(load.output, HasSubstr("no local checkpoint under")) << load.output;
  EXPECT_THAT(load.output, HasSubstr("load the global checkpoint instead"));
  save(3, /*run=*/1);
  expect_only_iteration(3);
  expect_load(3, 1);
}

// Rank 1 cannot start the background thread of an asynchronous save (clone3
// fails with EAGAIN, as at a thread limit). That used to fail rank 1
// alone, with "Resource temporarily unavailable", while rank 0 went on to
// wait in the finalize; now rank 1 writes on the calling thread and the
// save commits. Each thread rank 1 starts once the save has begun is failed
// in turn (which one is the save's is not fixed): no step may hang.
TEST_F(LocalFaultTest, AnAsynchronousSaveThatCannotStartItsThreadWritesOnTheCallingThread) {
  save(1);
  const int before =
      threads_started_before([&](const std::string& prefix) { return job("save 2 --async", "", prefix); }, 1, root_);
  ASSERT_GE(before, 0) << "rank 1 never touched " << root_;
  bool reached = false;
  for (int when = before + 1; when <= before + 4 && !reached; ++when) {
    const int64_t iteration = 10 + when;
    const CommandResult r = job(fmt::format("save {} --async", iteration), "", fail_thread_start_on_rank(1, when));
    ASSERT_FALSE(ran_out(r)) << "the job hung with rank 1's thread start " << when << " failed:\n" << r.output;
    reached = r.output.find("could not start a thread for the local checkpoint of iteration") != std::string::npos;
    if (reached) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
      expect_only_iteration(iteration);
      expect_load(iteration, 0);
    }
  }
  EXPECT_TRUE(reached) << "no step failed the save's own thread";
}

}  // namespace
