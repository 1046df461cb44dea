// Faults in `distckpt convert` of a torch.save file (to torch.save,
// safetensors and distckpt), injected from outside
// by strace at exact system calls: a write, fsync or rename that fails, a
// read of the source that fails, a kill in the middle. A failed export
// exits 2 naming the file and the errno text and leaves nothing at the
// destination and no staging file; a killed one leaves nothing at the
// destination, and the next export cleans up after it and succeeds.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/fault_jobs.h"
#include "support/ranks.h"

namespace {

using ::testing::HasSubstr;

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kSource = DISTCKPT_SOURCE_DIR;

class ExportFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
    const CommandResult py = run_command("cd " + kSource + "/tests/interop && /usr/bin/python3 write_torch_save.py " +
                                         shell_quote(dir_.file("py")));
    ASSERT_EQ(py.exit_code, 0) << py.output;
  }

  // `distckpt convert py/big.pt DST --to TO` under `prefix`.
  CommandResult convert(const std::string& prefix, const std::string& dst, const std::string& to) {
    return run_bounded(prefix + " " + kBin + "/distckpt convert " + shell_quote(dir_.file("py/big.pt")) + " " +
                       shell_quote(dst) + " --to " + to + " --quiet");
  }

  // Nothing of the export at `dst`, and no staging or lock file beside it.
  void expect_nothing_left(const std::string& dst) {
    EXPECT_FALSE(std::filesystem::exists(dst)) << dst;
    const std::string name = std::filesystem::path(dst).filename();
    EXPECT_FALSE(std::filesystem::exists(dir_.file("." + name + ".distckpt-staging"))) << name;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("." + name + ".distckpt-lock"))) << name;
  }

  // The export fails under `tamper` of `syscalls` on `file`, naming it and `errno_text`.
  void expect_failed(const std::string& to, const std::string& dst, const std::string& syscalls,
                     const std::string& file, const std::string& tamper, const std::string& errno_text) {
    expect_failed_under(strace_inject(syscalls, file, tamper), to, dst, file, errno_text, syscalls + " " + tamper);
  }
  void expect_failed_under(const std::string& prefix, const std::string& to, const std::string& dst,
                           const std::string& file, const std::string& errno_text,
                           const std::string& fault = "the first pwrite64 error=ENOSPC") {
    const CommandResult failed = convert(prefix, dst, to);
    EXPECT_EQ(failed.exit_code, 2) << failed.output;
    EXPECT_THAT(failed.output, HasSubstr(file));
    EXPECT_THAT(failed.output, HasSubstr(errno_text));
    EXPECT_EQ(failure_class(failed.output, "distckpt: "), "IoError") << failed.output;
    expect_nothing_left(dst);
    record_fault(fmt::format("convert --to {}: {} on '{}'", to, fault, std::filesystem::path(file).filename().string()),
                 failure_class(failed.output, "distckpt: ") + ", exit 2; nothing left at the destination");
  }

  TempDir dir_{"export-fault"};
};

// Writes 1-4 are the pickle and byteorder records, before any tensor.
TEST_F(ExportFaultTest, FailedWritesFsyncsAndRenamesOfATorchSaveFileLeaveNothing) {
  const std::string dst = dir_.file("out.pt"), staging = dir_.file(".out.pt.distckpt-staging");
  expect_failed("torch", dst, "pwrite64", staging, "error=ENOSPC:when=4", "No space left on device");
  expect_failed("torch", dst, "pwrite64", staging, "error=ENOSPC:when=7", "No space left on device");
  expect_failed("torch", dst, "fsync", staging, "error=EIO", "Input/output error");
  expect_failed("torch", dst, "renameat2", staging, "error=EACCES", "Permission denied");
  ASSERT_EQ(convert("", dst, "torch").exit_code, 0);  // and the next one works
}

TEST_F(ExportFaultTest, FailedWritesOfSafetensorsLeaveNothing) {
  const std::string dst = dir_.file("out"), file = dir_.file(".out.distckpt-staging/model.safetensors");
  // The header, written as the file is created (traced without seccomp:
  // strace 6.1's seccomp mode lets this first write on the new file pass).
  expect_failed_under(strace_command() + " -qq -o /dev/null -e trace=pwrite64 -P " + shell_quote(file) +
                          " -e inject=pwrite64:error=ENOSPC:when=1",
                      "safetensors", dst, file, "No space left on device");
  expect_failed("safetensors", dst, "pwrite64", file, "error=ENOSPC:when=2", "No space left on device");
  expect_failed("safetensors", dst, "fsync", file, "error=EIO", "Input/output error");
}

TEST_F(ExportFaultTest, AFailedReadOfTheSourceNamesIt) {
  const std::string src = dir_.file("py/big.pt");
  expect_failed("torch", dir_.file("out.pt"), "pread64", src, "error=EIO:when=20", "Input/output error");
  expect_failed("safetensors", dir_.file("out"), "pread64", src, "error=EIO:when=20", "Input/output error");
}

// The conversion to distckpt writes save()'s data file from the windows:
// the same faults leave nothing, and after a kill the next one commits a
// checkpoint whose every checksum matches.
TEST_F(ExportFaultTest, FailedAndKilledConversionsToDistckptLeaveNothing) {
  const std::string dst = dir_.file("out"), file = dir_.file(".out.distckpt-staging/data/rank_00000.bin");
  expect_failed("distckpt", dst, "openat", file, "error=EDQUOT", "Disk quota exceeded");  // before any byte
  expect_failed("distckpt", dst, "pwrite64", file, "error=ENOSPC:when=3", "No space left on device");
  expect_failed("distckpt", dst, "fsync", file, "error=EIO", "Input/output error");
  expect_failed("distckpt", dst, "pread64", dir_.file("py/big.pt"), "error=EIO:when=20", "Input/output error");
  const CommandResult killed = convert(strace_inject("pwrite64", file, "signal=SIGKILL:when=2"), dst, "distckpt");
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_FALSE(std::filesystem::exists(dst));
  ASSERT_EQ(convert("", dst, "distckpt").exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir_.file(".out.distckpt-staging")));
  const CommandResult verified = run_command(kBin + "/distckpt verify " + shell_quote(dst));
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
}

// Killed while writing: nothing at the destination; the leftover staging
// file goes with the next export, whose file torch.load reads.
TEST_F(ExportFaultTest, AKilledExportLeavesNothingAndTheNextOneSucceeds) {
  const std::string dst = dir_.file("out.pt"), staging = dir_.file(".out.pt.distckpt-staging");
  const CommandResult killed = convert(strace_inject("pwrite64", staging, "signal=SIGKILL:when=10"), dst, "torch");
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_FALSE(std::filesystem::exists(dst));
  EXPECT_TRUE(std::filesystem::exists(staging));
  ASSERT_EQ(convert("", dst, "torch").exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(staging));
  const CommandResult loaded = run_command(
      "/usr/bin/python3 -c \"import torch; d = torch.load('" + dst +
      "'); print(torch.equal(d['big'], torch.arange(12 << 20, dtype=torch.float32)), d['flag'].tolist())\"");
  EXPECT_EQ(loaded.output, "True [True, False, True]\n");
}

}  // namespace
