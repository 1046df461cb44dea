// The example trainer sending its weights to "inference" ranks of the same
// job every few steps (transfer, no storage), in real processes: GPT under
// tp 2 x pp 2 to two ranks in Llama names, MoE with experts over ep 4 to two
// ranks in Mixtral names. The inference ranks check every value they
// receive against the trainer's closed form (SGD on an elementwise loss) and
// the transfer compares every tensor's digest with the trainer's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iterator>
#include <regex>
#include <string>

#include "support/process.h"

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;

CommandResult job(int ranks, const std::string& flags) {
  return run_command(fmt::format("OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer {2} 2>&1",
                                 kBin, ranks, flags));
}

size_t count(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<size_t>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

// Each inference rank's line for each send: every tensor received, values
// within float rounding of the closed form; the plan made at the first send
// and replayed at the others.
void expect_received(const std::string& output, int sends, int tensors, int every) {
  for (int rank = 0; rank < 2; ++rank) {
    for (int send = 1; send <= sends; ++send) {
      const std::string line = fmt::format(
          "inference rank {} received step {}: {} tensors, values within [0-9.e+-]+ of the closed form, digests "
          "compared{}\n",
          rank, send * every, tensors, send == 1 ? "" : " \\(plan reused\\)");
      EXPECT_EQ(count(output, line), 1u) << line << "\n" << output;
    }
  }
}

TEST(TrainerTransfer, GptSendsItsWeightsToTwoInferenceRanksInLlamaNamesEveryTwoSteps) {
  const CommandResult r = job(6, "--tp 2 --pp 2 --steps 6 --send-every 2 --inference-ranks 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_received(r.output, 3, 39, 2);
}

TEST(TrainerTransfer, MoeSendsItsExpertsFromEpFourToTwoInferenceRanksInMixtralNames) {
  const CommandResult r =
      job(6, "--model moe --tp 2 --dp 2 --etp 1 --ep 4 --steps 2 --send-every 1 --inference-ranks 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_received(r.output, 2, 79, 1);
}

TEST(TrainerTransfer, InferenceRanksWithoutASendPeriodAreAClearError) {
  const CommandResult r = job(3, "--tp 2 --steps 2 --inference-ranks 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--inference-ranks and --send-every go together"), std::string::npos) << r.output;
}

}  // namespace
