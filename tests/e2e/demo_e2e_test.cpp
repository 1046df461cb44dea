// End to end with real processes: the demo under distckpt-launch saves with
// 4 ranks and loads with 2 and 8; the CLI verifies and digests.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/process.h"
#include "support/ranks.h"

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;

std::string demo(int ranks, int tp, int pp, const std::string& action, const std::string& dir) {
  return fmt::format("OMP_NUM_THREADS=1 {}/distckpt-launch -n {} -- {}/distckpt-demo --tp {} --pp {} --{} {}", kBin,
                     ranks, kBin, tp, pp, action, dir);
}

TEST(DemoEndToEnd, SaveWithFourRanksLoadWithTwoAndEightDigestsMatch) {
  TempDir tmp("e2e-demo");
  const std::string a = tmp.path() + "/a", b = tmp.path() + "/b";
  CommandResult saved = run_command(demo(4, 2, 2, "save", a));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  CommandResult two = run_command(demo(2, 1, 2, "load", a));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("rank 1 (tp 0/1, pp 1/2): loaded"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("13 values match"), std::string::npos) << two.output;
  CommandResult eight = run_command(demo(8, 4, 2, "load", a));
  ASSERT_EQ(eight.exit_code, 0) << eight.output;
  ASSERT_EQ(run_command(demo(4, 4, 1, "save", b)).exit_code, 0);

  CommandResult da = run_command(kBin + "/distckpt digest " + a), db = run_command(kBin + "/distckpt digest " + b);
  ASSERT_EQ(da.exit_code, 0) << da.output;
  EXPECT_EQ(da.output, db.output);
  EXPECT_NE(da.output.find("embedding.weight float32 [64,32] "), std::string::npos) << da.output;

  CommandResult inspect = run_command(kBin + "/distckpt inspect --json " + a);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("\"world_size\": 4"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("\"rng_state/shard_3_4\""), std::string::npos) << inspect.output;

  CommandResult ok = run_command(kBin + "/distckpt verify " + a);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  {
    std::fstream f(a + "/data/rank_00002.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x55');
  }
  CommandResult bad = run_command(kBin + "/distckpt verify " + a);
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("checksum mismatch: tensor '"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("data/rank_00002.bin"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find(": CORRUPT, 1 problem(s) found"), std::string::npos) << bad.output;
}

TEST(DemoEndToEnd, VerifyExitCodesAndJsonReport) {
  TempDir tmp("e2e-verify");
  const std::string a = tmp.path() + "/a";
  ASSERT_EQ(run_command(demo(2, 2, 1, "save", a)).exit_code, 0);
  CommandResult ok = run_command(kBin + "/distckpt verify --json " + a);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const nlohmann::json report = nlohmann::json::parse(ok.output);
  EXPECT_EQ(report.at("status"), "intact");
  EXPECT_EQ(report.at("exit_code"), 0);
  EXPECT_EQ(report.at("format_version"), 3);
  EXPECT_EQ(report.at("files"), 5);
  EXPECT_GT(report.at("blocks_checked").get<int>(), 0);
  EXPECT_TRUE(report.at("problems").empty());

  flip_byte(a + "/common.fb", 20);
  CommandResult corrupt = run_command(kBin + "/distckpt verify --json " + a);
  EXPECT_EQ(corrupt.exit_code, 1) << corrupt.output;
  const nlohmann::json bad = nlohmann::json::parse(corrupt.output);
  EXPECT_EQ(bad.at("status"), "corrupt");
  ASSERT_EQ(bad.at("problems").size(), 1u);
  EXPECT_NE(bad.at("problems")[0].get<std::string>().find("common.fb"), std::string::npos) << corrupt.output;

  CommandResult absent = run_command(kBin + "/distckpt verify " + tmp.path() + "/absent");
  EXPECT_EQ(absent.exit_code, 2) << absent.output;
  EXPECT_NE(absent.output.find("not a checkpoint"), std::string::npos) << absent.output;
  EXPECT_EQ(run_command(kBin + "/distckpt verify").exit_code, 2);
  EXPECT_EQ(run_command(kBin + "/distckpt verify --no-such-flag " + a).exit_code, 2);
  EXPECT_EQ(run_command(kBin + "/distckpt verify --help").exit_code, 0);
}

// One process alone (tp = pp = 1) saves and loads what four saved.
TEST(DemoEndToEnd, OneRankSavesAndLoadsWhatFourSaved) {
  TempDir tmp("e2e-one");
  const std::string four = tmp.path() + "/four", one = tmp.path() + "/one";
  ASSERT_EQ(run_command(demo(4, 2, 2, "save", four)).exit_code, 0);
  const CommandResult loaded = run_command("timeout 120 env " + demo(1, 1, 1, "load", four));
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_NE(loaded.output.find("rank 0 (tp 0/1, pp 0/1): loaded " + four + " saved by 4 ranks, 17 values match"),
            std::string::npos)
      << loaded.output;
  const CommandResult saved = run_command("timeout 120 env " + demo(1, 1, 1, "save", one));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  EXPECT_EQ(run_command(kBin + "/distckpt digest " + one).output,
            run_command(kBin + "/distckpt digest " + four).output);
  const CommandResult idle = run_command(kBin + "/distckpt-demo");
  EXPECT_EQ(idle.exit_code, 2);
  EXPECT_NE(idle.output.find("nothing to do: pass --save DIR, --load DIR or both"), std::string::npos) << idle.output;
}

// A checkpoint is untrusted: a link out of it is refused, not followed (it
// would make verify call another file intact), and a FIFO in place of a file
// is refused at once instead of blocking the reader.
TEST(DemoEndToEnd, VerifyNeitherFollowsLinksOutNorBlocksOnAFifo) {
  TempDir tmp("e2e-untrusted");
  const std::string a = tmp.path() + "/a", outside = tmp.path() + "/outside.bin";
  ASSERT_EQ(run_command(demo(2, 2, 1, "save", a)).exit_code, 0);
  const std::string data = a + "/data/rank_00000.bin";
  ASSERT_EQ(std::rename(data.c_str(), outside.c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), data.c_str()), 0);
  const CommandResult linked = run_command(kBin + "/distckpt verify " + a);
  EXPECT_EQ(linked.exit_code, 1) << linked.output;
  EXPECT_NE(linked.output.find(data + " resolves to " + std::filesystem::canonical(outside).string() +
                               ", outside the checkpoint"),
            std::string::npos)
      << linked.output;
  EXPECT_NE(run_command(kBin + "/distckpt digest " + a).exit_code, 0);
  ASSERT_EQ(::unlink(data.c_str()), 0);
  ASSERT_EQ(std::rename(outside.c_str(), data.c_str()), 0);
  ASSERT_EQ(run_command(kBin + "/distckpt verify " + a).exit_code, 0);

  for (const std::string name : {"metadata.fb", "metadata.json"}) {
    const std::string path = a + "/" + name, kept = tmp.path() + "/kept";
    ASSERT_EQ(std::rename(path.c_str(), kept.c_str()), 0);
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
    const CommandResult fifo = run_command("timeout 60 " + kBin + "/distckpt verify " + a);
    EXPECT_NE(fifo.exit_code, 124) << name << ": verify blocked on the FIFO";
    EXPECT_NE(fifo.exit_code, 0) << fifo.output;
    EXPECT_NE(fifo.output.find("is not a regular file (a FIFO)"), std::string::npos) << fifo.output;
    ASSERT_EQ(::unlink(path.c_str()), 0);
    ASSERT_EQ(std::rename(kept.c_str(), path.c_str()), 0);
  }
  const std::string pt = tmp.path() + "/model.pt";
  ASSERT_EQ(::mkfifo(pt.c_str(), 0644), 0);
  const CommandResult fifo = run_command("timeout 60 " + kBin + "/distckpt inspect " + pt);
  EXPECT_NE(fifo.exit_code, 124) << "inspect blocked on the FIFO";
  EXPECT_NE(fifo.exit_code, 0) << fifo.output;
}

TEST(DemoEndToEnd, LoadingAnUncommittedDirectoryFailsOnEveryRank) {
  TempDir tmp("e2e-uncommitted");
  CommandResult r = run_command(demo(2, 1, 2, "load", tmp.path()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds no committed distckpt checkpoint"), std::string::npos) << r.output;
}

}  // namespace
