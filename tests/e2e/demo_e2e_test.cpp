// End to end with real processes: the demo under distckpt-launch saves with
// 4 ranks and loads with 2 and 8; the CLI verifies and digests.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>

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
}

TEST(DemoEndToEnd, LoadingAnUncommittedDirectoryFailsOnEveryRank) {
  TempDir tmp("e2e-uncommitted");
  CommandResult r = run_command(demo(2, 1, 2, "load", tmp.path()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds no committed distckpt checkpoint"), std::string::npos) << r.output;
}

}  // namespace
