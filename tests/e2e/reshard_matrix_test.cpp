// The resharding matrix with real processes: the example trainer saves under
// one mesh, loads under another and saves again; `distckpt digest` of both
// checkpoints must be equal (layout-independent hashes of every tensor).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "distckpt/distckpt.h"
#include "support/process.h"
#include "support/ranks.h"

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;

// ep folds into tp * dp (Megatron's parallel folding; etp defaults to tp).
struct Mesh {
  int tp, pp, dp, ep;
  int size() const { return tp * pp * dp; }
};

std::string trainer(const Mesh& m, const std::string& flags) {
  return fmt::format(
      "OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer --tp {2} --pp {3} --dp {4} "
      "--ep {5} {6}",
      kBin, m.size(), m.tp, m.pp, m.dp, m.ep, flags);
}

std::string digest(const std::string& dir) {
  const CommandResult r = run_command(kBin + "/distckpt digest " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// Trains 2 steps under `from`, saves A; loads A under `to`, saves B.
void expect_reshard(const Mesh& from, const Mesh& to, const std::string& model_flags) {
  TempDir tmp("matrix");
  const std::string a = tmp.path() + "/a", b = tmp.path() + "/b";
  const CommandResult saved = run_command(trainer(from, model_flags + " --steps 2 --save " + a));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CommandResult loaded = run_command(trainer(to, model_flags + " --load " + a + " --save " + b));
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  const std::string da = digest(a);
  EXPECT_FALSE(da.empty());
  EXPECT_EQ(da, digest(b));
}

const std::string kGpt = "--model gpt --layers 8 --hidden 64 --heads 8 --kv-groups 2 --ffn 128 --vocab 256";
const std::string kMoe = "--model moe --layers 4 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 128 --experts 8";

struct Case {
  const char* name;
  Mesh from, to;
  std::string model;
};
// Test logs name the case instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Every case runs with Adam state, saved ZeRO-1 style (each dp rank writes its
// flat range) or in full; digests cover parameters and optimizer state.
class ReshardMatrix : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(ReshardMatrix, DigestsEqualAfterReshard) {
  const auto& [c, zero] = GetParam();
  expect_reshard(c.from, c.to, c.model + " --optimizer adam --distributed-optimizer " + (zero ? "1" : "0"));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ReshardMatrix,
    ::testing::Combine(
        ::testing::Values(Case{"GptTp2Pp4ToTp4Pp2", {2, 4, 1, 1}, {4, 2, 1, 1}, kGpt},
                          Case{"GptPp8ToTp8", {1, 8, 1, 1}, {8, 1, 1, 1}, kGpt},
                          Case{"GptTp2Dp4ToPp8", {2, 1, 4, 1}, {1, 8, 1, 1}, kGpt},
                          Case{"GptOneRankToTp2Pp2Dp2", {1, 1, 1, 1}, {2, 2, 2, 1}, kGpt},
                          Case{"GptTiedTp2Pp2ToPp4", {2, 2, 1, 1}, {1, 4, 1, 1}, kGpt + " --tie-embeddings 1"},
                          Case{"MoeTp2Pp2Ep2ToEp8", {2, 2, 2, 2}, {1, 1, 8, 8}, kMoe},
                          Case{"MoeEp4ToTp2Pp2", {1, 1, 4, 4}, {2, 2, 1, 1}, kMoe},
                          Case{"MoeEp2Edp2ToTp2Pp2", {1, 1, 4, 2}, {2, 2, 1, 1}, kMoe}),
        ::testing::Bool()),
    [](const ::testing::TestParamInfo<ReshardMatrix::ParamType>& info) {
      return std::string(std::get<0>(info.param).name) + (std::get<1>(info.param) ? "Zero" : "Full");
    });

// A padded vocabulary grows between save and load: the stored rows come back,
// the new rows are zero, every other tensor is unchanged.
TEST(ReshardPadding, PaddedVocabularyGrowsFrom96To128) {
  TempDir tmp("matrix-vocab");
  const std::string a = tmp.path() + "/a", b = tmp.path() + "/b";
  const std::string model = "--model gpt --layers 2 --hidden 32 --heads 4 --ffn 64";
  ASSERT_EQ(run_command(trainer({2, 1, 1, 1}, model + " --vocab 96 --steps 1 --save " + a)).exit_code, 0);
  const CommandResult r = run_command(trainer({4, 2, 1, 1}, model + " --vocab 128 --load " + a + " --save " + b));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const distckpt::StateDict before = distckpt::load_plain_tensors(a), after = distckpt::load_plain_tensors(b);
  for (const char* key : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    const at::Tensor old_rows = before.at(key).as_tensor(), new_rows = after.at(key).as_tensor();
    ASSERT_EQ(new_rows.size(0), 128);
    EXPECT_TRUE(at::equal(new_rows.narrow(0, 0, 96), old_rows)) << key;
    EXPECT_EQ(new_rows.narrow(0, 96, 32).abs().sum().item<float>(), 0.0f) << key;
  }
  EXPECT_TRUE(at::equal(after.at("decoder.layers.mlp.linear_fc1.weight").as_tensor(),
                        before.at("decoder.layers.mlp.linear_fc1.weight").as_tensor()));
}

}  // namespace
