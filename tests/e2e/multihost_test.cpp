// Several hosts on one machine: each host is a network namespace with its own
// host name, link and storage directory (e2e/netns_hosts.sh); the ranks of a
// job rendezvous at host 0's address. Covers the load exchange's cross-host
// choice, local checkpoint replicas on the other host, recovery of a lost
// host, and a host cut off mid-save. Needs root; skipped otherwise.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "io/file.h"
#include "support/process.h"
#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

const std::string kScript = "bash " DISTCKPT_BIN_DIR "/netns_hosts.sh";
const std::string kProbe = DISTCKPT_BIN_DIR "/distckpt_multihost_probe";
const std::string kLauncher = DISTCKPT_BIN_DIR "/distckpt-launch";
const std::string kCli = "timeout -s KILL 60 " DISTCKPT_BIN_DIR "/distckpt";
constexpr int kHosts = 3;  // most tests use two of them
constexpr int kRanksPerHost = 2;
constexpr uint64_t kEmbBytes = 256 * 512 * 4;  // the probe's replicated tensor
// Names carry the test process id, so a later run can remove the namespaces of
// one that was killed before its cleanup (netns_hosts.sh gc).
const std::string kPrefix = "dcmh";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Until ranks 0 .. count-1 each published DIR/STEM<rank>; false when the job
// ended first (it failed: its output says why) or after `limit`.
bool wait_for_files(const std::string& dir, const std::string& stem, int count, const std::future<CommandResult>& job,
                    std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    int found = 0;
    for (int r = 0; r < count; ++r) found += distckpt::io::exists(fmt::format("{}/{}{}", dir, stem, r)) ? 1 : 0;
    if (found == count) return true;
    if (Clock::now() > deadline || job.wait_for(std::chrono::milliseconds(50)) == std::future_status::ready) {
      return false;
    }
  }
}

// "rank R host H bytes_read B equal" lines of a load, by rank.
struct LoadLine {
  std::string host;
  uint64_t bytes_read = 0;
  bool equal = false;
};
std::map<int, LoadLine> load_lines(const std::string& output) {
  std::map<int, LoadLine> lines;
  const std::regex pattern(R"(rank (\d+) host (\S+) bytes_read (\d+) (equal|DIFFERENT))");
  for (std::sregex_iterator it(output.begin(), output.end(), pattern), end; it != end; ++it) {
    lines[std::stoi((*it)[1])] = LoadLine{(*it)[2], std::stoull((*it)[3]), (*it)[4] == "equal"};
  }
  return lines;
}

uint64_t total_read(const std::map<int, LoadLine>& lines) {
  uint64_t sum = 0;
  for (const auto& [rank, line] : lines) sum += line.bytes_read;
  return sum;
}

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    const CommandResult check = run_command(kScript + " check");
    if (check.exit_code != 0) GTEST_SKIP() << "multi-host tests need network namespaces: " << check.output;
    run_command(kScript + " gc " + kPrefix);
    static std::atomic<int> counter{0};
    name_ = fmt::format("{}{}-{}", kPrefix, getpid(), counter++);
    const CommandResult up = run_command(fmt::format("{} up {} {}", kScript, name_, kHosts));
    ASSERT_EQ(up.exit_code, 0) << up.output;
  }

  // Also after a failed assertion: nothing of the run stays behind.
  void TearDown() override {
    if (!name_.empty()) down();
  }

  // The probe on hosts 0 .. hosts-1, `ranks` each ("%h": the host index).
  CommandResult job(const std::string& args, int hosts = 2, int ranks = kRanksPerHost) const {
    return run_command(fmt::format("DISTCKPT_LAUNCH={} JOB_TIMEOUT=90 {} job {} {} {} -- {} {}", kLauncher, kScript,
                                   name_, hosts, ranks, kProbe, args));
  }

  // A command on one host, killed after `limit` seconds.
  CommandResult on_host(int host, const std::string& command, int limit = 90) const {
    return run_command(fmt::format("{} exec {} {} timeout -s KILL {} {}", kScript, name_, host, limit, command));
  }

  uint64_t link_bytes(int host) const {
    return std::stoull(run_command(fmt::format("{} bytes {} {}", kScript, name_, host)).output);
  }

  void down() const { run_command(kScript + " down " + name_); }

  // Declared after a running job's future, takes the hosts down before that
  // future waits for the job, so a failed assertion does not wait out its timeout.
  struct DownOnExit {
    const MultiHost* hosts;
    ~DownOnExit() { hosts->down(); }
  };

  std::string name_;
};

// Ranks 0-1 on host0, 2-3 on host1. With the default exchange (auto) the
// ranks compare host names: on two hosts, the replicated tensor is read from
// storage by one rank and sent over the links to the others; on one host,
// one rank reads it and the others copy it out of shared memory.
TEST_F(MultiHost, LoadExchangeSendsSharedPiecesAcrossHostsOnly) {
  TempDir tmp("multihost-exchange");
  const std::string dir = tmp.file("ckpt");
  const CommandResult saved = job("save " + dir);
  ASSERT_EQ(saved.exit_code, 0) << saved.output;

  uint64_t before = link_bytes(1);
  const CommandResult none = job("load " + dir + " --exchange none");
  const uint64_t none_traffic = link_bytes(1) - before;
  ASSERT_EQ(none.exit_code, 0) << none.output;
  before = link_bytes(1);
  const CommandResult automatic = job("load " + dir + " --resave " + tmp.file("again"));
  const uint64_t auto_traffic = link_bytes(1) - before;
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  const CommandResult one_host =
      on_host(0, fmt::format("{} -n 4 --master-addr 127.0.0.1 --tag-output -- {} load {}", kLauncher, kProbe, dir));
  ASSERT_EQ(one_host.exit_code, 0) << one_host.output;

  const auto none_lines = load_lines(none.output);
  const auto auto_lines = load_lines(automatic.output);
  const auto one_host_lines = load_lines(one_host.output);
  ASSERT_EQ(auto_lines.size(), 4u) << automatic.output;
  ASSERT_EQ(none_lines.size(), 4u) << none.output;
  ASSERT_EQ(one_host_lines.size(), 4u) << one_host.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(auto_lines.at(r).host, fmt::format("host{}", r / kRanksPerHost));
    EXPECT_TRUE(auto_lines.at(r).equal && none_lines.at(r).equal && one_host_lines.at(r).equal) << "rank " << r;
    EXPECT_EQ(one_host_lines.at(r).host, "host0");
  }
  // Across hosts, the replicated tensor left storage once instead of 4 times...
  EXPECT_EQ(total_read(none_lines) - total_read(auto_lines), 3 * kEmbBytes) << automatic.output << none.output;
  int readers = 0;
  for (const auto& [rank, line] : auto_lines) readers += line.bytes_read >= kEmbBytes ? 1 : 0;
  EXPECT_EQ(readers, 1) << automatic.output;
  // ...and crossed host1's link once per rank on the reader's far side: two
  // copies (point to point, not one per host; the reader's host-mate gets its
  // copy over loopback).
  EXPECT_GE(auto_traffic, 2 * kEmbBytes);
  EXPECT_LT(auto_traffic, 3 * kEmbBytes);
  EXPECT_LT(none_traffic, kEmbBytes / 2);
  // On one host too, the replicated tensor leaves storage once.
  EXPECT_EQ(total_read(none_lines) - total_read(one_host_lines), 3 * kEmbBytes) << one_host.output;

  // The loaded state, saved again, has the original's digest.
  const CommandResult digest = run_command(kCli + " digest " + dir);
  const CommandResult again = run_command(kCli + " digest " + tmp.file("again"));
  ASSERT_EQ(digest.exit_code, 0) << digest.output;
  EXPECT_THAT(digest.output, HasSubstr("emb"));
  EXPECT_EQ(digest.output, again.output);
}

// A transfer over two hosts (ranks 0-1 on host0, 2-3 on host1), each rank
// asking for the next rank's rows: ranks 0 and 2 read theirs straight out of
// their host-mate's memory; ranks 1 and 3 need rows held on the other host,
// which cross the link as messages (sent by either rank of that host).
TEST_F(MultiHost, TransferReadsWithinAHostAndSendsBetweenHosts) {
  const uint64_t before = link_bytes(1);
  const CommandResult r = job("transfer -");
  const uint64_t traffic = link_bytes(1) - before;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex pattern(R"(rank (\d+) host (\S+) transferred (\d+) of (\d+) bytes read directly (equal|DIFFERENT))");
  std::map<int, std::pair<uint64_t, uint64_t>> direct;  // rank -> (read directly, received)
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), pattern), end; it != end; ++it) {
    const int rank = std::stoi((*it)[1]);
    EXPECT_EQ((*it)[2], fmt::format("host{}", rank / kRanksPerHost)) << r.output;
    EXPECT_EQ((*it)[5], "equal") << r.output;
    direct[rank] = {std::stoull((*it)[3]), std::stoull((*it)[4])};
  }
  ASSERT_EQ(direct.size(), 4u) << r.output;
  constexpr uint64_t kRows = 1024 * 256 * 4;  // one rank's rows
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(direct[rank].second, kRows) << r.output;
    EXPECT_EQ(direct[rank].first, rank % 2 == 0 ? kRows : 0u) << "rank " << rank << "\n" << r.output;
  }
  // Two ranks' rows crossed host1's link, once each way (the job's rendezvous and planning add ~90 KB).
  EXPECT_GE(traffic, 2 * kRows);
  EXPECT_LT(traffic, 3 * kRows);
}

// J=2 ranks per host, F=2: cliques {0,2} and {1,3} span the two hosts, so
// each host's storage holds the other host's checkpoints. Host 1 then dies
// (every process, and its disk): host 0's ranks fail instead of hanging, and
// a restart on a replacement host 1 recovers ranks 2 and 3 from host 0.
TEST_F(MultiHost, LocalReplicasCrossHostsAndRecoverALostHost) {
  TempDir tmp("multihost-local");
  const std::string root = tmp.file("storage");
  const std::string gate = tmp.file("gate");
  distckpt::io::make_dirs(gate);
  const uint64_t before = link_bytes(1);
  auto running =
      std::async(std::launch::async, [&] { return job(fmt::format("local-save {}/host%h 3 --hold {}", root, gate)); });
  const bool all_saved = wait_for_files(gate, "saved.rank", 4, running, std::chrono::seconds(90));
  const DownOnExit down_on_exit{this};
  if (!all_saved) {
    down();
    FAIL() << running.get().output;
  }

  const std::string host0 = root + "/host0", host1 = root + "/host1";
  for (int owner = 0; owner < 4; ++owner) {
    const int holder = owner % kRanksPerHost;  // its clique peer on host 0 ...
    const int peer = holder + kRanksPerHost;   // ... and on host 1
    const std::string file = fmt::format("iter_3_owner_{}.dcl", owner);
    const std::string on0 = fmt::format("{}/rank_{}/{}", host0, holder, file);
    const std::string on1 = fmt::format("{}/rank_{}/{}", host1, peer, file);
    ASSERT_TRUE(distckpt::io::exists(on0)) << on0;
    ASSERT_TRUE(distckpt::io::exists(on1)) << on1;
    EXPECT_EQ(slurp(on0), slurp(on1)) << file;  // the replica is the owner's file
  }
  // Every file crossed host 1's link once (to host 1, or from it).
  uint64_t file_bytes = 0;
  for (int owner = 0; owner < 4; ++owner) {
    file_bytes +=
        distckpt::io::file_size(fmt::format("{}/rank_{}/iter_3_owner_{}.dcl", owner < 2 ? host0 : host1, owner, owner));
  }
  EXPECT_GE(link_bytes(1) - before, file_bytes);
  EXPECT_FALSE(distckpt::io::exists(host0 + "/rank_2"));
  EXPECT_FALSE(distckpt::io::exists(host1 + "/rank_0"));

  const auto lost_at = Clock::now();
  ASSERT_EQ(run_command(fmt::format("{} kill {} 1", kScript, name_)).exit_code, 0);
  const CommandResult held = running.get();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - lost_at).count();
  EXPECT_THAT(held.output, HasSubstr("host 1 exit 137"));
  EXPECT_THAT(held.output, HasSubstr("host 0 exit 1"));
  EXPECT_THAT(held.output, HasSubstr("rank 0 host host0 failed:"));
  EXPECT_THAT(held.output, HasSubstr("rank 1 host host0 failed:"));
  EXPECT_LT(seconds, 30) << held.output;

  distckpt::io::remove_tree(host1);  // the replacement host's disk is empty
  const CommandResult load = job(fmt::format("local-load {}/host%h 3", root));
  ASSERT_EQ(load.exit_code, 0) << load.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(load.output,
                HasSubstr(fmt::format("rank {} host host{} loaded iteration 3 bitwise-equal recovered=[2,3]", r,
                                      r / kRanksPerHost)));
  }
  EXPECT_THAT(load.output, HasSubstr("rank 2 recovered iteration 3 from the replica on rank 0"));
  EXPECT_THAT(load.output, HasSubstr("rank 3 recovered iteration 3 from the replica on rank 1"));
  EXPECT_TRUE(distckpt::io::exists(host1 + "/rank_2/iter_3_owner_2.dcl"));  // restored in place
  EXPECT_TRUE(distckpt::io::exists(host1 + "/rank_3/iter_3_owner_3.dcl"));
}

// Host 1's link goes down while an asynchronous save is in flight (planned,
// data being written, not finalized). Every rank fails within the collective
// timeout (5 s), nothing is committed, and with the link back a save succeeds.
TEST_F(MultiHost, HostCutOffMidSaveFailsEveryRankAndCommitsNothing) {
  TempDir tmp("multihost-cut");
  const std::string dir = tmp.file("ckpt");
  const std::string gate = tmp.file("gate");
  distckpt::io::make_dirs(gate);
  auto running = std::async(std::launch::async,
                            [&] { return job(fmt::format("save {} --gate {} --timeout-ms 5000", dir, gate)); });
  const bool all_started = wait_for_files(gate, "started.rank", 4, running, std::chrono::seconds(90));
  const DownOnExit down_on_exit{this};
  if (!all_started) {
    down();
    FAIL() << running.get().output;
  }
  ASSERT_EQ(run_command(fmt::format("{} link {} 1 down", kScript, name_)).exit_code, 0);
  const auto cut_at = Clock::now();
  std::ofstream(gate + "/go") << "\n";
  const CommandResult save = running.get();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - cut_at).count();

  EXPECT_NE(save.exit_code, 0);
  for (int host = 0; host < 2; ++host) EXPECT_THAT(save.output, HasSubstr(fmt::format("host {} exit 1", host)));
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(save.output, HasSubstr(fmt::format("rank {} host host{} failed:", r, r / kRanksPerHost)));
  }
  EXPECT_THAT(save.output, HasSubstr("Timed out waiting 5000ms"));
  EXPECT_THAT(save.output, ::testing::Not(HasSubstr(" saved")));
  EXPECT_LT(seconds, 20) << save.output;  // one timeout, and an agreement after it
  EXPECT_FALSE(distckpt::io::exists(dir)) << "neither committed nor staged";
  EXPECT_EQ(run_command("ls -A " + tmp.path()).output, "gate\n");
  EXPECT_NE(run_command(kCli + " verify " + dir).exit_code, 0);

  ASSERT_EQ(run_command(fmt::format("{} link {} 1 up", kScript, name_)).exit_code, 0);
  const CommandResult retry = job("save " + dir + " --timeout-ms 30000");
  ASSERT_EQ(retry.exit_code, 0) << retry.output;
  EXPECT_EQ(run_command(kCli + " verify " + dir).exit_code, 0);
}

// Ranks on hosts other than MASTER_ADDR's bind Gloo to the address their
// route to it leaves from. Host names here resolve to nothing, so binding by
// host name fell back to loopback: hosts 1 and 2 then could not connect to
// each other (with two hosts only host 1 dialled host 0, which hid it).
TEST_F(MultiHost, ThreeHostsConnectWithoutResolvableHostNames) {
  TempDir tmp("multihost-three");
  const CommandResult saved = job("save " + tmp.file("ckpt") + " --timeout-ms 30000", 3, 1);
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  for (int r = 0; r < 3; ++r) EXPECT_THAT(saved.output, HasSubstr(fmt::format("rank {} host host{} saved", r, r)));
  EXPECT_THAT(saved.output, ::testing::Not(HasSubstr("Using the loopback address")));
  EXPECT_EQ(run_command(kCli + " verify " + tmp.file("ckpt")).exit_code, 0);
}

}  // namespace
