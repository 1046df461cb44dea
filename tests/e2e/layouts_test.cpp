// The layouts of large-scale training, with real processes and the example
// trainer: virtual (interleaved) pipeline stages and explicit asymmetric
// layouts, MoE parallel folding (experts over etp x ep x edp of the dense
// ranks), context parallelism, and the distributed optimizer over dp x cp
// (edp for experts) within instances. For each, a run interrupted under one
// layout and resumed under another ends bitwise equal to an uninterrupted
// run: the checkpoint is layout-independent, optimizer state included.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "distckpt/distckpt.h"
#include "support/process.h"
#include "support/ranks.h"

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kGpt =
    "--model gpt --layers 8 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 64 --optimizer adam";
const std::string kMoe =
    "--model moe --layers 4 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 128 --experts 8 --mtp-layers 1 "
    "--optimizer adam";

// A layout: its trainer flags and rank count.
struct Layout {
  int ranks;
  std::string flags;
};

CommandResult trainer(const Layout& layout, const std::string& model, const std::string& flags) {
  return run_command(
      fmt::format("OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer {2} {3} {4} "
                  "2>&1",
                  kBin, layout.ranks, model, layout.flags, flags));
}

std::string digest(const std::string& dir) {
  const CommandResult r = run_command(kBin + "/distckpt digest " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// 4 steps under `from`; 2 steps under `from`, saved, loaded under `to`, 2
// more steps: both checkpoints hold the same bytes. Returns the digest.
std::string expect_resume_across(const Layout& from, const Layout& to, const std::string& model) {
  TempDir tmp("layouts");
  const std::string full = tmp.path() + "/full", half = tmp.path() + "/half", resumed = tmp.path() + "/resumed";
  for (const auto& [layout, flags] :
       {std::pair{&from, "--steps 4 --save " + full}, std::pair{&from, "--steps 2 --save " + half},
        std::pair{&to, "--load " + half + " --steps 2 --save " + resumed}}) {
    const CommandResult r = trainer(*layout, model, flags);
    EXPECT_EQ(r.exit_code, 0) << layout->flags << " " << flags << "\n" << r.output;
    if (r.exit_code != 0) return "";
  }
  const std::string want = digest(full);
  EXPECT_NE(want.find("optimizer.state.exp_avg_sq."), std::string::npos) << want;
  EXPECT_EQ(digest(resumed), want) << from.flags << " -> " << to.flags;
  EXPECT_TRUE(distckpt::verify_checkpoint(resumed).intact());
  EXPECT_EQ(distckpt::load_common_state_dict(resumed).at("iteration").as_int(), 4);
  return want;
}

const Layout kInterleaved{4, "--pp 2 --vp 2 --dp 2"};  // 8 layers: stage 0 holds 0-1 and 4-5

TEST(Layouts, InterleavedPipelineResumesUnderFourStagesWithoutVirtualOnes) {
  expect_resume_across(kInterleaved, {4, "--pp 4 --vp 1"}, kGpt);
}

TEST(Layouts, InterleavedPipelineResumesWithoutPipelineParallelism) {
  expect_resume_across(kInterleaved, {4, "--tp 2 --dp 2"}, kGpt);
}

TEST(Layouts, InterleavedPipelineResumesUnderAnAsymmetricLayoutAndBack) {
  // 8 layers as 1 | 3 on stage 0's chunks, 2 | 2 on stage 1's, in virtual-stage order: 1, 2, 3, 2.
  const Layout asymmetric{4, "--pp 2 --vp 2 --dp 2 --pipeline-layout 1,2,3,2"};
  const std::string want = expect_resume_across(kInterleaved, asymmetric, kGpt);
  EXPECT_EQ(expect_resume_across(asymmetric, {2, "--pp 2"}, kGpt), want);
}

TEST(Layouts, AnAsymmetricLayoutThatDoesNotAddUpIsAClearError) {
  const CommandResult r = trainer({4, "--pp 2 --vp 2 --dp 2 --pipeline-layout 1,2,3,1"}, kGpt, "--steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("decoder.layers: the pipeline layout places 7 elements but there are 8"), std::string::npos)
      << r.output;
}

// Experts folded over 8 ranks (dense tp 2 x dp 4, experts etp 1 x ep 4 x edp
// 2), multi-token prediction on the last stage: resumed without folding
// (etp = tp) under pp 2 x vp 2, and under ep 8.
TEST(Layouts, MoeParallelFoldingResumesWithoutFoldingAndUnderAnotherEp) {
  const Layout folded{8, "--tp 2 --dp 4 --etp 1 --ep 4"};
  const std::string want = expect_resume_across(folded, {8, "--tp 2 --dp 2 --pp 2 --vp 2 --ep 2"}, kMoe);
  EXPECT_NE(want.find("mtp.layers.eh_proj.weight float32 [1,32,64]"), std::string::npos) << want;
  EXPECT_NE(want.find("decoder.layers.mlp.experts.linear_fc1.weight float32 [4,8,128,32]"), std::string::npos) << want;
  EXPECT_EQ(expect_resume_across(folded, {8, "--dp 8 --ep 8"}, kMoe), want);
}

TEST(Layouts, ExpertMeshThatDoesNotFoldIntoTheStageIsAClearError) {
  const CommandResult r = trainer({4, "--tp 2 --dp 2"}, kMoe, "--ep 8 --etp 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("etp*ep = 8 does not divide tp*cp*dp = 4"), std::string::npos) << r.output;
}

// Context parallel 2, the distributed optimizer over dp x cp in 2 instances
// (each instance's 2 ranks shard the state; the other instance holds
// replicas), resumed with cp 1 and the optimizer over dp 4.
TEST(Layouts, ContextParallelWithOptimizerInstancesResumesWithoutContextParallelism) {
  expect_resume_across({8, "--tp 2 --cp 2 --dp 2 --optimizer-instances 2"}, {8, "--tp 2 --dp 4"}, kGpt);
}

}  // namespace
