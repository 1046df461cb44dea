// End to end with real processes: the demo under distckpt-launch saves with
// 4 ranks and loads with 2 and 8; the CLI verifies and digests.
#include <fmt/format.h>
#include <gtest/gtest.h>

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
  EXPECT_EQ(report.at("format_version"), 2);
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

TEST(DemoEndToEnd, LoadingAnUncommittedDirectoryFailsOnEveryRank) {
  TempDir tmp("e2e-uncommitted");
  CommandResult r = run_command(demo(2, 1, 2, "load", tmp.path()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds no committed distckpt checkpoint"), std::string::npos) << r.output;
}

}  // namespace
