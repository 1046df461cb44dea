// `distckpt diff` of a checkpoint and its resave under another tensor-parallel
// size: the tensors and common state are equal, the per-tp objects
// (_extra_state) are saved on another shard grid and cannot be compared, so
// diff says so and exits 0, unless asked to compare objects too.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support/process.h"
#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kGpt = "--model gpt --layers 2 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 128";

CommandResult run(const std::string& command) { return run_command(command + " 2>&1"); }

TEST(DiffReshard, AResaveUnderAnotherTensorParallelSizeDiffersOnlyInLayoutDependentObjects) {
  TempDir tmp("diff-reshard");
  const std::string a = tmp.path() + "/a", b = tmp.path() + "/b";
  const auto trainer = [&](int tp, const std::string& flags) {
    return run(fmt::format("OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer --tp {1} {2} {3}",
                           kBin, tp, kGpt, flags));
  };
  const CommandResult saved = trainer(2, "--optimizer adam --steps 2 --save " + a);
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CommandResult resaved = trainer(4, "--optimizer adam --load " + a + " --save " + b);
  ASSERT_EQ(resaved.exit_code, 0) << resaved.output;

  const CommandResult diff = run(kBin + "/distckpt diff " + a + " " + b);
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_THAT(diff.output, HasSubstr("\n= decoder.layers.")) << diff.output;
  EXPECT_THAT(diff.output, HasSubstr("~ object decoder.layers.self_attention.core_attention._extra_state: grid "))
      << diff.output;
  EXPECT_THAT(diff.output, HasSubstr("(saved under another layout: not compared)"));
  EXPECT_THAT(diff.output, Not(HasSubstr("\n! ")));
  EXPECT_THAT(diff.output,
              HasSubstr("\nequal tensors and common state; objects differ (they decide with --objects)\n"));

  const CommandResult strict = run(kBin + "/distckpt diff --objects " + a + " " + b);
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_THAT(strict.output, HasSubstr("\ndifferent\n"));

  const CommandResult json = run_command(kBin + "/distckpt diff --json " + a + " " + b);
  EXPECT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json j = nlohmann::json::parse(json.output);
  EXPECT_TRUE(j.at("equal").get<bool>());
  EXPECT_TRUE(j.at("tensors_equal").get<bool>());
  EXPECT_FALSE(j.at("objects_equal").get<bool>());
  EXPECT_FALSE(j.at("objects").at("other_grid").empty());
  EXPECT_TRUE(j.at("objects").at("differ").empty());
}

}  // namespace
