// Hung ranks in real 2-rank jobs: rank 1 is stopped (SIGSTOP, delivered by
// strace at its first write or read of its data file, so always in the
// middle of the save or load). With DISTCKPT_TIMEOUT_SECONDS=3, rank 0 must
// fail with a timeout error that says what happened and what to do, the
// launcher must stop the job, and no process of it may survive.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "support/fault_jobs.h"
#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

// Whether `pid` is a process that is not a zombie.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, name, state;
  if (!(stat >> pid_field >> name >> state)) return false;
  return state != "Z";
}

class HungRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
  }

  // Runs ACTION with rank 1 stopped at its first `syscall` on `file`; checks
  // rank 0's timeout error, the time it took, and that the job is gone.
  void expect_timeout(const std::string& action, int seed, const std::string& syscall, const std::string& file) {
    const std::string stop_rank_1 =
        "sh -c " +
        shell_quote("if [ \"$RANK\" = 1 ]; then exec " + strace_inject(syscall, file, "signal=SIGSTOP:when=1") +
                    " \"$@\"; else exec \"$@\"; fi") +
        " sh";
    const auto start = std::chrono::steady_clock::now();
    const CommandResult job =
        run_bounded("env DISTCKPT_TIMEOUT_SECONDS=3 " +
                    probe_job(ckpt_, action, seed, "--pid-dir " + shell_quote(dir_), stop_rank_1));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    EXPECT_EQ(job.exit_code, 1) << job.output;
    EXPECT_LT(seconds, 60) << job.output;
    EXPECT_THAT(job.output, HasSubstr("distckpt-launch: rank 0 exited with code 1"));
    const std::vector<std::string> lines = lines_starting(job.output, "rank 0 failed: ");
    ASSERT_THAT(lines, SizeIs(1)) << job.output;
    EXPECT_THAT(lines[0], HasSubstr("timed out after 3 s on rank 0 of 2"));
    EXPECT_THAT(lines[0], HasSubstr("a peer rank is probably hung"));
    EXPECT_THAT(lines[0], HasSubstr("raise the timeout (DISTCKPT_TIMEOUT_SECONDS"));
    EXPECT_THAT(job.output, Not(HasSubstr("rank 1 failed")));  // it never ran on
    std::cout << action << " with a stopped rank failed after " << seconds << " s\n";

    // The stopped rank must be gone too; give it a moment, then kill it (and fail).
    std::ifstream pid_file(dir_ + "/pid.1");
    pid_t stopped = 0;
    ASSERT_TRUE(pid_file >> stopped) << "rank 1 wrote no pid file";
    for (int i = 0; i < 100 && alive(stopped); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const bool survived = alive(stopped);
    if (survived) ::kill(stopped, SIGKILL);
    EXPECT_FALSE(survived) << "the stopped rank (pid " << stopped << ") outlived the job";
  }

  TempDir temp_{"hung-rank"};
  const std::string dir_ = canonical_path(temp_.path());
  const std::string ckpt_ = dir_ + "/ckpt";
};

TEST_F(HungRankTest, RankStoppedDuringSaveMakesTheOtherFailWithATimeout) {
  expect_timeout("save", 1, "pwrite64", dir_ + "/.ckpt.distckpt-staging/data/rank_00001.bin");
  // Nothing was committed.
  EXPECT_FALSE(std::ifstream(ckpt_ + "/metadata.json").good());
}

TEST_F(HungRankTest, RankStoppedDuringLoadMakesTheOtherFailWithATimeout) {
  const CommandResult saved = run_bounded(probe_job(ckpt_, "save", 1));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  expect_timeout("load", 1, "pread64", ckpt_ + "/data/rank_00001.bin");
}

}  // namespace
