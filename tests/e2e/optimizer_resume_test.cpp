// Exact training resume with Adam through the generated optimizer layout,
// with real processes: an interrupted run (save, load, continue) ends
// bitwise equal to an uninterrupted one, and a load under another mesh
// carries the optimizer state over unchanged.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "distckpt/distckpt.h"
#include "support/process.h"
#include "support/ranks.h"

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kModel = "--model gpt --layers 4 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 64";

CommandResult trainer(int ranks, const std::string& mesh, const std::string& flags) {
  return run_command(fmt::format("OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer {2} {3} {4}",
                                 kBin, ranks, kModel, mesh, flags));
}

std::string digest(const std::string& dir) {
  const CommandResult r = run_command(kBin + "/distckpt digest " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

void expect_ok(const CommandResult& r) { ASSERT_EQ(r.exit_code, 0) << r.output; }

TEST(OptimizerResume, InterruptedAdamRunEqualsUninterruptedBitwise) {
  for (const char* optimizer : {"adam", "adamw"}) {
    TempDir tmp("resume");
    const std::string mesh = "--tp 2 --pp 2 --dp 2";
    const std::string opt = std::string("--optimizer ") + optimizer;
    expect_ok(trainer(8, mesh, opt + " --steps 4 --save " + tmp.path() + "/full"));
    expect_ok(trainer(8, mesh, opt + " --steps 2 --save " + tmp.path() + "/half"));
    expect_ok(trainer(8, mesh, opt + " --load " + tmp.path() + "/half --steps 2 --save " + tmp.path() + "/resumed"));
    const std::string full = digest(tmp.path() + "/full");
    EXPECT_NE(full.find("optimizer.state.exp_avg_sq.decoder.layers.mlp.linear_fc1.weight float32 [4,128,32]"),
              std::string::npos)
        << full;
    EXPECT_EQ(digest(tmp.path() + "/resumed"), full) << optimizer;
    const distckpt::StateDict common = distckpt::load_common_state_dict(tmp.path() + "/resumed");
    EXPECT_EQ(common.at("optimizer").at("step").as_int(), 4);
    EXPECT_EQ(common.at("iteration").as_int(), 4);
  }
}

// Asynchronous saves whose copy overlaps the next forward/backward (issue 16
// item 2): each holds exactly the state of its step, though later optimizer
// steps changed every parameter and Adam moment it was copied from.
TEST(OptimizerResume, BackgroundStagedSavesDuringTrainingHoldTheirStepsState) {
  TempDir tmp("resume-async");
  const std::string mesh = "--tp 2 --pp 2 --dp 2", opt = "--optimizer adam";
  expect_ok(trainer(8, mesh, opt + " --steps 2 --save " + tmp.path() + "/half"));
  expect_ok(trainer(8, mesh,
                    opt + " --steps 4 --save " + tmp.path() + "/full --async-save-every 2 --async-save-root " +
                        tmp.path() + "/during"));
  EXPECT_EQ(digest(tmp.path() + "/during/iter_0000002"), digest(tmp.path() + "/half"));
  EXPECT_EQ(digest(tmp.path() + "/during/iter_0000004"), digest(tmp.path() + "/full"));
  EXPECT_EQ(distckpt::load_common_state_dict(tmp.path() + "/during/iter_0000002").at("iteration").as_int(), 2);
}

TEST(OptimizerResume, ZeroShardedStateLoadsUnderAnotherMesh) {
  TempDir tmp("resume-mesh");
  const std::string a = tmp.path() + "/a", b = tmp.path() + "/b";
  // Saved ZeRO-1 over dp=4: each dp rank wrote a quarter of every chunk's state.
  expect_ok(trainer(8, "--tp 2 --dp 4", "--optimizer adam --steps 3 --save " + a));
  const distckpt::StateDict meta = distckpt::load_tensors_metadata(a);
  EXPECT_TRUE(meta.contains("optimizer.state.exp_avg.output_layer.weight"));
  expect_ok(trainer(8, "--pp 4 --dp 2", "--optimizer adam --load " + a + " --save " + b));
  EXPECT_EQ(digest(a), digest(b));
  EXPECT_TRUE(distckpt::verify_checkpoint(b).intact());
}

}  // namespace
