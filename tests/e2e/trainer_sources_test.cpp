// What the example trainer starts from, tried as a new user would: its own
// checkpoint exported to safetensors or torch.save (weights only: iteration
// 0, fresh optimizer state, said once), and a distckpt checkpoint that lacks
// the trainer's common state (an error naming the key and the file). Real
// processes through distckpt-launch and the distckpt CLI.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "support/process.h"
#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kGpt = "--model gpt --layers 4 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 128";

CommandResult trainer(int tp, int pp, const std::string& flags) {
  return run_command(fmt::format(
      "OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer --tp {2} --pp {3} {4} {5} 2>&1", kBin,
      tp * pp, tp, pp, kGpt, flags));
}

CommandResult cli(const std::string& args) { return run_command(kBin + "/distckpt " + args + " 2>&1"); }

// The digest lines of the model's tensors (the optimizer's left out).
std::string model_digest(const std::string& dir) {
  const CommandResult r = cli("digest " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  std::string out, line;
  while (std::getline(in, line)) {
    if (line.rfind("optimizer.", 0) != 0) out += line + "\n";
  }
  return out;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

class TrainerSources : public ::testing::Test {
 protected:
  void SetUp() override {
    const CommandResult saved = trainer(2, 2, "--optimizer adam --steps 2 --save " + path("a"));
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
  }
  std::string path(const std::string& rel) const { return tmp_.path() + "/" + rel; }
  TempDir tmp_{"trainer-sources"};
};

TEST_F(TrainerSources, WeightsOnlyExportsStartTrainingAtIterationZero) {
  ASSERT_EQ(cli("convert " + path("a") + " " + path("st") + " --to safetensors --quiet").exit_code, 0);
  ASSERT_EQ(cli("convert " + path("a") + " " + path("a.pt") + " --to torch --quiet").exit_code, 0);
  for (const char* source : {"st", "a.pt"}) {
    const std::string saved = path(std::string("from-") + source);
    // Another mesh: tp 4, pp 1.
    const CommandResult r = trainer(4, 1, "--optimizer adam --steps 0 --load " + path(source) + " --save " + saved);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string said = fmt::format(
        "{} holds weights only ({}): starting at iteration 0 with fresh optimizer "
        "state",
        path(source), std::string(source) == "st" ? "safetensors" : "torch");
    EXPECT_EQ(count(r.output, said), 1u) << r.output;  // once, by rank 0
    EXPECT_THAT(r.output, HasSubstr("local layers on rank 0, iteration 0, loaded " + path(source))) << r.output;
    EXPECT_THAT(r.output, Not(HasSubstr("not found"))) << r.output;
    EXPECT_EQ(model_digest(saved), model_digest(path("a"))) << source;
  }
}

TEST_F(TrainerSources, ADistckptCheckpointWithoutTheTrainersCommonStateIsNamed) {
  // Through safetensors and back: every tensor, no common state.
  ASSERT_EQ(cli("convert " + path("a") + " " + path("st") + " --to safetensors --quiet").exit_code, 0);
  ASSERT_EQ(cli("convert " + path("st") + " " + path("c") + " --to distckpt --quiet").exit_code, 0);
  const CommandResult r = trainer(2, 2, "--optimizer adam --steps 0 --load " + path("c"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the checkpoint '" + path("c") + "' has no common value 'iteration' (not in '" +
                                  path("c") + "/common.fb')"))
      << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("the dict has"))) << r.output;
}

}  // namespace
