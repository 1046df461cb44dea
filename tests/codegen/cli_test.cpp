// The distckpt-gen command: its exit status and what it tells the user.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace distckpt::gen {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct GenRun {
  int status = -1;
  std::string output;  // stdout and stderr
};

GenRun run_gen(const std::string& arguments) {
  const std::string command = std::string(DISTCKPT_BIN_DIR) + "/distckpt-gen " + arguments + " 2>&1";
  GenRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("distckpt_gen_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "tiny.shard")
        << "layout tiny;\nconfig { rows: int; }\nmesh tp;\ntensor w [rows] split(0 by tp);\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

TEST_F(Cli, WritesTheHeaderAndTheSource) {
  const GenRun run = run_gen((dir_ / "tiny.shard").string() + " --out-dir " + (dir_ / "out").string());
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "tiny.shard.h"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "tiny.shard.cpp"));
}

// Usage errors exit 2 like unreadable files (not CLI11's own codes); --help
// and --version exit 0; a file name that cannot go into an #include is refused.
TEST_F(Cli, UsageErrorsExitTwoAndHelpAndVersionZero) {
  EXPECT_EQ(run_gen("").status, 2);
  EXPECT_EQ(run_gen("--bogus").status, 2);
  EXPECT_EQ(run_gen((dir_ / "tiny.shard").string() + " -o ''").status, 2);
  EXPECT_EQ(run_gen("--help").status, 0);
  const GenRun version = run_gen("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_THAT(version.output, ::testing::MatchesRegex("distckpt-gen [0-9]+\\.[0-9]+\\.[0-9]+\n"));
  fs::copy_file(dir_ / "tiny.shard", dir_ / "we\"ird.shard");
  const GenRun odd = run_gen("'" + (dir_ / "we\"ird.shard").string() + "' -o " + (dir_ / "out").string());
  EXPECT_EQ(odd.status, 2);
  EXPECT_THAT(odd.output, HasSubstr("would appear in a C++ #include; rename it"));
  EXPECT_FALSE(fs::exists(dir_ / "out"));
}

TEST_F(Cli, AByteOrderMarkIsSkipped) {
  std::ofstream(dir_ / "bom.shard") << "\xEF\xBB\xBFlayout bom;\nmesh tp;\ntensor w [4] split(0 by tp);\n";
  const GenRun run = run_gen((dir_ / "bom.shard").string() + " --out-dir " + (dir_ / "out").string());
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "bom.shard.h"));
}

TEST_F(Cli, AnOutputDirectoryItCannotCreateFailsWithTheOsError) {
  std::ofstream(dir_ / "file") << "x";
  const GenRun run = run_gen((dir_ / "tiny.shard").string() + " --out-dir " + (dir_ / "file" / "out").string());
  EXPECT_EQ(run.status, 2);
  EXPECT_EQ(run.output, "distckpt-gen: cannot create the output directory " + (dir_ / "file" / "out").string() +
                            ": Not a directory\n");
}

TEST_F(Cli, AMissingSchemaFailsWithTheOsError) {
  const GenRun run = run_gen((dir_ / "none.shard").string());
  EXPECT_EQ(run.status, 2);
  EXPECT_THAT(run.output, HasSubstr("cannot read " + (dir_ / "none.shard").string() + ": No such file or directory"));
}

TEST_F(Cli, SchemaErrorsExitWithOne) {
  std::ofstream(dir_ / "bad.shard") << "layout bad;\ntensor w [n];\n";
  const GenRun run = run_gen((dir_ / "bad.shard").string() + " --out-dir " + (dir_ / "out").string());
  EXPECT_EQ(run.status, 1);
  EXPECT_THAT(run.output, HasSubstr("bad.shard:2:11: error: unknown config parameter 'n'"));
  EXPECT_FALSE(fs::exists(dir_ / "out"));
}

}  // namespace
}  // namespace distckpt::gen
