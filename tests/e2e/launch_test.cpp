// distckpt-launch as a user runs it: real processes, their environment, exit
// codes, stopping the job when a rank fails, and communicator_from_env
// connecting the launched ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kLauncher = DISTCKPT_BIN_DIR "/distckpt-launch";
const std::string kProbe = DISTCKPT_BIN_DIR "/distckpt_comm_probe";

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line. `timeout -s KILL` bounds it, so a launcher that
// failed to stop its ranks fails the test (exit 137) instead of hanging it.
Outcome run_shell(const std::string& command) {
  const std::string bounded = "timeout -s KILL 120 " + command + " 2>&1";
  Outcome outcome;
  FILE* pipe = popen(bounded.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) outcome.output.append(buffer, n);
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return outcome;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(LaunchTest, EachRankSeesItsEnvironment) {
  TempDir dir("launch-env");
  const Outcome outcome =
      run_shell(kLauncher + " -n 3 -- /bin/sh -c 'echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE " +
                "$MASTER_ADDR $MASTER_PORT\" > " + dir.path() + "/rank_$RANK.txt'");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.output;
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream fields(read_file(dir.file("rank_" + std::to_string(rank) + ".txt")));
    std::string seen_rank, world, local_rank, local_world, addr, rank_port;
    fields >> seen_rank >> world >> local_rank >> local_world >> addr >> rank_port;
    EXPECT_EQ(seen_rank, std::to_string(rank));
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local_rank, std::to_string(rank));
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(addr, "127.0.0.1");
    ASSERT_FALSE(rank_port.empty()) << "rank " << rank << " saw no MASTER_PORT";
    const int port_number = std::stoi(rank_port);
    EXPECT_GT(port_number, 0);
    EXPECT_LE(port_number, 65535);
    if (rank == 0) port = rank_port;
    EXPECT_EQ(rank_port, port) << "every rank must rendezvous on the same port";
  }
}

// One launcher per machine: node K of M starts ranks K*N .. K*N+N-1.
TEST(LaunchTest, NodeRankOffsetsTheRanks) {
  TempDir dir("launch-nodes");
  const Outcome outcome =
      run_shell(kLauncher + " --nnodes 3 --node-rank 1 -n 2 --master-port 29998 --tag-output -- /bin/sh -c " +
                "'echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE\" > " + dir.path() + "/rank_$RANK.txt'");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_EQ(read_file(dir.file("rank_2.txt")), "2 6 0 2\n");
  EXPECT_EQ(read_file(dir.file("rank_3.txt")), "3 6 1 2\n");
  EXPECT_FALSE(std::ifstream(dir.file("rank_0.txt")).good());

  const Outcome no_port = run_shell(kLauncher + " --nnodes 2 --node-rank 0 -n 1 -- true");
  EXPECT_EQ(no_port.exit_code, 2);
  EXPECT_THAT(no_port.output, HasSubstr("--nnodes 2 needs --master-port (the same on every node)"));
  const Outcome bad_node = run_shell(kLauncher + " --nnodes 2 --node-rank 2 -n 1 --master-port 29998 -- true");
  EXPECT_EQ(bad_node.exit_code, 2);
  EXPECT_THAT(bad_node.output, HasSubstr("--node-rank 2 must be below --nnodes 2"));
}

TEST(LaunchTest, ExplicitMasterAddressAndPortArePassedOn) {
  TempDir dir("launch-port");
  const Outcome outcome = run_shell(kLauncher + " -n 2 --master-addr localhost --master-port=29999 -- /bin/sh -c " +
                                    "'echo \"$MASTER_ADDR:$MASTER_PORT\" > " + dir.path() + "/rank_$RANK.txt'");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_EQ(read_file(dir.file("rank_0.txt")), "localhost:29999\n");
  EXPECT_EQ(read_file(dir.file("rank_1.txt")), "localhost:29999\n");
}

TEST(LaunchTest, AFailingRankFailsTheLauncherAndIsNamed) {
  const Outcome outcome = run_shell(kLauncher + " -n 3 -- /bin/sh -c 'if [ \"$RANK\" = 1 ]; then exit 3; fi'");
  EXPECT_EQ(outcome.exit_code, 3);
  EXPECT_THAT(outcome.output, HasSubstr("distckpt-launch: rank 1 exited with code 3"));
}

TEST(LaunchTest, SleepingRanksAreStoppedWhenAnotherFails) {
  // Without the launcher stopping them, ranks 0 and 1 would sleep past the
  // 120 s bound of run_shell and the exit code would be 137.
  const Outcome outcome =
      run_shell(kLauncher + " -n 3 -- /bin/sh -c 'if [ \"$RANK\" = 2 ]; then exit 5; fi; sleep 600'");
  EXPECT_EQ(outcome.exit_code, 5) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("rank 2 exited with code 5"));
}

TEST(LaunchTest, RanksIgnoringSigtermAreKilled) {
  // Rank 1 ignores SIGTERM (and so does its sleep), then says it is ready;
  // only then does rank 0 fail, so the launcher must escalate to SIGKILL.
  TempDir dir("launch-kill");
  const std::string ready = dir.file("ready");
  const Outcome outcome =
      run_shell(kLauncher + " -n 2 -- /bin/sh -c 'if [ \"$RANK\" = 0 ]; then while [ ! -f " + ready +
                " ]; do sleep 0.05; done; exit 4; fi; trap \"\" TERM; touch " + ready + "; sleep 600'");
  EXPECT_EQ(outcome.exit_code, 4) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("rank 0 exited with code 4"));
}

TEST(LaunchTest, StoppedRanksAreContinuedSoTheyCanActOnSigterm) {
  // Rank 1 stops itself (SIGSTOP); once it is stopped, rank 0 fails. Only if
  // the launcher continues it after SIGTERM does its trap run and leave a
  // file; otherwise it is killed (SIGKILL) at the end of the grace period.
  TempDir dir("launch-stopped");
  const std::string stopped = dir.file("stopped");
  const std::string termed = dir.file("termed");
  const Outcome outcome =
      run_shell(kLauncher + " -n 2 -- /bin/sh -c 'if [ \"$RANK\" = 0 ]; then while [ ! -f " + stopped +
                " ]; do sleep 0.05; done; "
                "while [ \"$(cut -d\" \" -f3 /proc/$(cat " +
                stopped + ")/stat)\" != T ]; do sleep 0.05; done; exit 4; fi; trap \"touch " + termed +
                "; exit 7\" TERM; echo $$ > " + stopped + ".tmp && mv " + stopped + ".tmp " + stopped +
                "; kill -STOP $$; sleep 600'");
  EXPECT_EQ(outcome.exit_code, 4) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("rank 0 exited with code 4"));
  EXPECT_TRUE(std::ifstream(termed).good()) << "rank 1 never ran its SIGTERM trap: " << outcome.output;
}

TEST(LaunchTest, RanksDieWithAKilledLauncher) {
  // kill -9 gives the launcher no chance to stop its ranks; the kernel must.
  // A rank counts as gone once it is no process or only a zombie. Each rank
  // publishes its pid by rename, so a pid file is never seen half-written.
  TempDir dir("launch-orphans");
  const std::string d = dir.path();
  const Outcome outcome =
      run_shell("/bin/sh -c '" + kLauncher + " -n 3 -- /bin/sh -c \"echo \\$\\$ > " + d + "/tmp.\\$RANK && mv " + d +
                "/tmp.\\$RANK " + d +
                "/pid.\\$RANK; exec sleep 600\" >/dev/null 2>&1 & L=$!; "
                "for i in $(seq 200); do [ -f " +
                d + "/pid.0 ] && [ -f " + d + "/pid.1 ] && [ -f " + d +
                "/pid.2 ] && break; sleep 0.05; done; "
                "kill -9 $L; "
                "alive() { s=$(cut -d\" \" -f3 /proc/$1/stat 2>/dev/null); [ -n \"$s\" ] && [ \"$s\" != Z ]; }; "
                "for i in $(seq 200); do n=0; for p in $(cat " +
                d +
                "/pid.*); do alive $p && n=$((n+1)); done; "
                "[ $n = 0 ] && break; sleep 0.05; done; "
                "for p in $(cat " +
                d +
                "/pid.*); do alive $p && echo survivor $p && kill -9 $p; done; "
                "echo ranks started: $(cat " +
                d + "/pid.* | wc -l)'");
  EXPECT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("ranks started: 3"));
  EXPECT_THAT(outcome.output, Not(HasSubstr("survivor")));
}

TEST(LaunchTest, TagOutputPrefixesEveryLineWithItsRank) {
  const Outcome outcome = run_shell(kLauncher + " -n 2 --tag-output -- /bin/sh -c 'echo out$RANK; echo err$RANK >&2'");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.output;
  for (const char* line : {"[rank 0] out0\n", "[rank 1] out1\n", "[rank 0] err0\n", "[rank 1] err1\n"}) {
    EXPECT_THAT(outcome.output, HasSubstr(line));
  }
}

TEST(LaunchTest, UsageErrorsExitWithTwo) {
  Outcome outcome = run_shell(kLauncher + " -- /bin/true");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.output, HasSubstr("pass -n N"));
  outcome = run_shell(kLauncher + " -n zero -- /bin/true");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.output, HasSubstr("-n expects an integer"));
  outcome = run_shell(kLauncher + " -n 2");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.output, HasSubstr("the program to run is missing"));
  outcome = run_shell(kLauncher + " -n 2 --bogus -- /bin/true");
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_THAT(outcome.output, HasSubstr("unknown option '--bogus'"));
}

TEST(LaunchTest, RanksConnectWithCommunicatorFromEnv) {
  TempDir dir("launch-probe");
  const Outcome outcome = run_shell(kLauncher + " -n 3 -- " + kProbe + " " + dir.path());
  ASSERT_EQ(outcome.exit_code, 0) << outcome.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(read_file(dir.file("rank_" + std::to_string(rank) + ".txt")),
              "size=3 ranks=0,1,2 greeting=hello from 2 agreement=ok\n")
        << "rank " << rank;
  }
}

TEST(LaunchTest, AgreementAcrossProcessesNamesTheFailingRank) {
  TempDir dir("launch-agree");
  const Outcome outcome = run_shell(kLauncher + " -n 3 -- " + kProbe + " " + dir.path() + " 1");
  EXPECT_EQ(outcome.exit_code, 3) << outcome.output;
  EXPECT_THAT(outcome.output, HasSubstr("exited with code 3"));
  // Every rank reached the agreement, so every rank wrote its report: the same one.
  for (int rank : {0, 1, 2}) {
    EXPECT_THAT(read_file(dir.file("rank_" + std::to_string(rank) + ".txt")),
                HasSubstr("agreement=probe step failed on rank(s) 1: rank 1 (ShardingError): probe failure\n"))
        << "rank " << rank;
  }
}

}  // namespace
