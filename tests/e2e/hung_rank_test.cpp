// Hung ranks in real 2-rank jobs: rank 1 is stopped (SIGSTOP, delivered by
// strace at its first write or read of its data file, so always in the
// middle of the save or load, or at its first connect, before the job's
// communicator exists). With DISTCKPT_TIMEOUT_SECONDS=3, rank 0 must
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

  // Runs ACTION with rank 1 stopped by `stop` (an strace prefix); checks
  // that rank 0 failed within the bound and that the job is gone; returns
  // rank 0's error line.
  std::string expect_stopped_rank_fails_the_job(const std::string& action, int seed, const std::string& stop) {
    const std::string stop_rank_1 =
        "sh -c " + shell_quote("if [ \"$RANK\" = 1 ]; then exec " + stop + " \"$@\"; else exec \"$@\"; fi") + " sh";
    const auto start = std::chrono::steady_clock::now();
    const CommandResult job =
        run_bounded("env DISTCKPT_TIMEOUT_SECONDS=3 " + probe_job(ckpt_, action, seed, "", stop_rank_1));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    EXPECT_EQ(job.exit_code, 1) << job.output;
    EXPECT_LT(seconds, 60) << job.output;
    EXPECT_THAT(job.output, HasSubstr("distckpt-launch: rank 0 exited with code 1"));
    EXPECT_THAT(job.output, Not(HasSubstr("rank 1 failed")));  // it never ran on
    std::cout << action << " with a stopped rank failed after " << seconds << " s\n";
    record_fault(action + " of 2 ranks, DISTCKPT_TIMEOUT_SECONDS=3: rank 1 stopped (SIGSTOP)",
                 failure_class(job.output, "rank 0 failed: ") + " on rank 0 after " +
                     std::to_string(static_cast<int>(seconds)) + " s; the launcher stopped the job");
    expect_stopped_rank_gone();
    const std::vector<std::string> lines = lines_starting(job.output, "rank 0 failed: ");
    EXPECT_THAT(lines, SizeIs(1)) << job.output;
    return lines.empty() ? "" : lines[0];
  }

  // ACTION with rank 1 stopped at its first `syscall` on `file`: rank 0's
  // timeout error says what happened and what to do.
  void expect_timeout(const std::string& action, int seed, const std::string& syscall, const std::string& file) {
    const std::string line =
        expect_stopped_rank_fails_the_job(action, seed, strace_inject(syscall, file, "signal=SIGSTOP:when=1"));
    EXPECT_THAT(line, HasSubstr("rank 0 failed: TimeoutError: "));
    EXPECT_THAT(line, HasSubstr("timed out after 3 s on rank 0 of 2"));
    EXPECT_THAT(line, HasSubstr("a peer rank is probably hung"));
    EXPECT_THAT(line, HasSubstr("raise the timeout (DISTCKPT_TIMEOUT_SECONDS"));
  }

  // Every process of the job (the stopped rank, its strace) must be gone
  // too; give them a moment, then kill them (and fail).
  void expect_stopped_rank_gone() {
    std::vector<pid_t> left = job_processes();
    for (int i = 0; i < 100 && !left.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      left = job_processes();
    }
    for (pid_t pid : left) ::kill(pid, SIGKILL);
    EXPECT_THAT(left, SizeIs(0)) << "processes of the job outlived it";
  }

  // Live processes whose command line names this test's checkpoint.
  std::vector<pid_t> job_processes() const {
    std::vector<pid_t> found;
    for (const std::string& name : list_dir("/proc")) {
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream cmdline("/proc/" + name + "/cmdline");
      const std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
      const pid_t pid = static_cast<pid_t>(std::stol(name));
      if (pid != ::getpid() && args.find(ckpt_) != std::string::npos && alive(pid)) found.push_back(pid);
    }
    return found;
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

// Rank 1 stops at its first connect (before its communicator exists): rank
// 0 waits for it to arrive no longer than the same timeout, and names it.
TEST_F(HungRankTest, RankStoppedWhileConnectingMakesTheOtherFailWithinTheTimeout) {
  const std::string line = expect_stopped_rank_fails_the_job(
      "save", 1, strace_command() + " -qq -o /dev/null -e trace=connect -e inject=connect:signal=SIGSTOP:when=1");
  EXPECT_THAT(line, HasSubstr("rank 0 failed: TimeoutError: rank 0 of 2: only 1 of 2 ranks started within the "
                              "timeout of 3 s; rank(s) 1 never arrived"));
  EXPECT_THAT(line, HasSubstr("raise the timeout (DISTCKPT_TIMEOUT_SECONDS"));
  EXPECT_FALSE(std::ifstream(ckpt_ + "/metadata.json").good());
}

TEST_F(HungRankTest, RankStoppedDuringLoadMakesTheOtherFailWithATimeout) {
  const CommandResult saved = run_bounded(probe_job(ckpt_, "save", 1));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  expect_timeout("load", 1, "pread64", ckpt_ + "/data/rank_00001.bin");
}

}  // namespace
