// s3:// wherever a path is taken, tried as a user would: the example
// trainer saves and loads (resharding) through an S3-protocol server, its
// asynchronous saves land there, the CLI verifies, digests, lists and
// converts both ways, and the AWS CLI sees ordinary objects. Real processes
// through distckpt-launch; moto_server as the server (without signature
// checks: see multirank/s3_checkpoint_test.cpp).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "support/process.h"
#include "support/ranks.h"
#include "support/s3_server.h"

namespace {

using ::testing::HasSubstr;

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kGpt = "--model gpt --layers 4 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 128";

class S3Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = MotoServer::shared(MotoServer::Signatures::kUnchecked);
    if (!server_) GTEST_SKIP() << kMotoMissing;
    tmp_ = make_temp_dir("s3-cli");
    std::random_device random;
    prefix_ = fmt::format("s3://{}/cli-{:08x}", MotoServer::kBucket, random());
  }
  void TearDown() override {
    if (!tmp_.empty()) std::filesystem::remove_all(tmp_);
  }

  // Run from the temporary directory, so that a path taken for a local one
  // would show up there.
  CommandResult run(const std::string& command) const {
    return run_command(
        fmt::format("cd {} && {} OMP_NUM_THREADS=1 {} 2>&1", tmp_, server_->shell_environment(), command));
  }
  CommandResult trainer(int tp, int pp, int dp, const std::string& flags) const {
    return run(fmt::format("{0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer --tp {2} --pp {3} --dp {4} {5} {6}",
                           kBin, tp * pp * dp, tp, pp, dp, kGpt, flags));
  }
  CommandResult cli(const std::string& args) const { return run(kBin + "/distckpt " + args); }
  std::string s3(const std::string& name) const { return prefix_ + "/" + name; }
  std::string local(const std::string& name) const { return tmp_ + "/" + name; }

  // The digest lines of the model's tensors (the optimizer's left out).
  std::string model_digest(const std::string& where) const {
    const CommandResult r = cli("digest " + where);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::istringstream in(r.output);
    std::string out, line;
    while (std::getline(in, line)) {
      if (line.rfind("optimizer.", 0) != 0) out += line + "\n";
    }
    return out;
  }
  bool nothing_local_named_s3() const { return !std::filesystem::exists(tmp_ + "/s3:"); }

  MotoServer* server_ = nullptr;
  std::string tmp_, prefix_;
};

TEST_F(S3Cli, TheTrainerSavesTp2Pp2AndResumesTp1Pp2Dp2ThroughS3) {
  const CommandResult saved = trainer(2, 2, 1, "--optimizer adam --steps 2 --save " + s3("a"));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CommandResult resumed = trainer(1, 2, 2, "--optimizer adam --steps 0 --load " + s3("a") + " --save " + s3("b"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(nothing_local_named_s3());
  EXPECT_EQ(model_digest(s3("b")), model_digest(s3("a")));
  const CommandResult verified = cli("verify " + s3("b"));
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  const CommandResult inspected = cli("inspect " + s3("a"));
  EXPECT_EQ(inspected.exit_code, 0) << inspected.output;
  EXPECT_THAT(inspected.output, HasSubstr("decoder"));
  // Saving again without --overwrite is refused, saying what to do.
  const CommandResult again = trainer(2, 2, 1, "--steps 0 --load " + s3("a") + " --save " + s3("a"));
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.output, HasSubstr("already holds a committed checkpoint"));

  // The AWS CLI reads what distckpt wrote as ordinary objects.
  if (run_command("command -v aws >/dev/null").exit_code != 0)
    GTEST_SKIP() << "aws CLI not installed: cross-check skipped";
  const CommandResult listed = run("aws s3 ls --recursive " + s3("a") + "/");
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("a/metadata.json"));
  EXPECT_THAT(listed.output, HasSubstr("rank_00003.bin"));
  const CommandResult marker = run("aws s3 cp " + s3("a") + "/metadata.json -");
  EXPECT_THAT(marker.output, HasSubstr("\"format\": \"distckpt\""));
}

TEST_F(S3Cli, ConvertsLocalToS3AndBackWithEqualDigests) {
  const CommandResult saved = trainer(2, 1, 1, "--steps 1 --save " + local("a"));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::string expected = model_digest(local("a"));
  for (const auto& [from, to, flags] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {local("a"), s3("c"), "--to distckpt"},     // distckpt up
           {s3("c"), local("d"), "--to safetensors"},  // safetensors down
           {local("d"), s3("e"), "--to safetensors"},  // safetensors up
           {s3("e"), local("f"), "--to distckpt"},     // distckpt down
       }) {
    const CommandResult r = cli(fmt::format("convert {} {} {}", from, to, flags));
    ASSERT_EQ(r.exit_code, 0) << from << " -> " << to << ": " << r.output;
    EXPECT_EQ(model_digest(to), expected) << to;
  }
  // A torch.save file read straight from the bucket (written locally, copied up).
  if (run_command("command -v aws >/dev/null").exit_code == 0) {
    ASSERT_EQ(cli(fmt::format("convert {} {} --to torch", s3("c"), local("t.pt"))).exit_code, 0);
    ASSERT_EQ(run(fmt::format("aws s3 cp {} {}", local("t.pt"), s3("t.pt"))).exit_code, 0);
    EXPECT_EQ(model_digest(s3("t.pt")), expected);
  }
  const CommandResult taken = cli(fmt::format("convert {} {} --to distckpt", local("a"), s3("c")));
  EXPECT_NE(taken.exit_code, 0);
  EXPECT_THAT(taken.output, HasSubstr("already exists"));
  EXPECT_TRUE(nothing_local_named_s3());
}

TEST_F(S3Cli, AsyncSavesLandUnderAnS3RootThatLsLists) {
  const CommandResult r =
      trainer(2, 1, 1, "--optimizer adam --steps 2 --async-save-every 1 --async-save-root " + s3("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const CommandResult listed = cli("ls --verify " + s3("run"));
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("iter_0000001"));
  EXPECT_THAT(listed.output, HasSubstr("iter_0000002"));
  const CommandResult verified = cli("verify " + s3("run") + "/iter_0000002");
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_TRUE(nothing_local_named_s3());
}

TEST_F(S3Cli, OfTwoJobsSavingOnePrefixExactlyOneCommits) {
  CommandResult first, second;
  std::thread other([&] { second = trainer(2, 1, 1, "--steps 1 --save " + s3("x")); });
  first = trainer(2, 1, 1, "--steps 1 --save " + s3("x"));
  other.join();
  EXPECT_EQ((first.exit_code == 0) + (second.exit_code == 0), 1) << first.output << "\n----\n" << second.output;
  const CommandResult& lost = first.exit_code == 0 ? second : first;
  EXPECT_THAT(lost.output,
              ::testing::AnyOf(HasSubstr("another save committed"), HasSubstr("already holds a committed checkpoint")));
  EXPECT_EQ(cli("verify " + s3("x")).exit_code, 0);
}

}  // namespace
