// I/O faults in real 2-rank jobs (distckpt-launch + distckpt_fault_probe),
// injected from outside the program: strace fails chosen syscalls on one
// file, a preloaded library makes the kernel write less than asked, a small
// tmpfs fills up. A failed save must fail every rank naming the file and the
// errno text, commit nothing, keep the previous checkpoint of that name and
// leave the next save working; a failed read must fail every rank naming the
// file and the offset.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "probes/fault_state.h"
#include "support/fault_jobs.h"
#include "support/ranks.h"

namespace {

using ::testing::ContainsRegex;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

// A thread that cannot start (EAGAIN at the thread limit): neither a file nor a caller's mistake.
const std::string kThreadStartClass = "Error";

// Seed 1 saved once, by ranks as threads (cheaper than a launched job), into
// a directory the tests copy: each starts from the same committed checkpoint.
struct Seed1 {
  Seed1() {
    try {
      run_ranks(2, [&](distckpt::Communicator& comm) {
        distckpt::SaveOptions options;
        options.overwrite = true;
        distckpt::save(fault_state(comm.rank(), comm.size(), 1, 4, true), dir.file("ckpt"), comm, options);
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    digest_text = digest(dir.file("ckpt"));
  }
  TempDir dir{"io-fault-seed1"};  // removed at exit
  std::string error;
  std::string digest_text;
};

const Seed1& seed1() {
  static const Seed1 seed;
  return seed;
}

class IoFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = strace_unavailable()) GTEST_SKIP() << *why;
    ASSERT_EQ(seed1().error, "");
    ASSERT_THAT(seed1().digest_text, HasSubstr("w float32 ")) << seed1().digest_text;
    ASSERT_EQ(run_command("cp -a " + shell_quote(seed1().dir.file("ckpt")) + " " + shell_quote(ckpt_)).exit_code, 0);
  }

  // Saves seed 2 over seed 1 (overwrite) under `job_prefix` (an strace
  // injection), expecting that save to fail on both ranks with errors naming
  // `file` and `errno_text`; then checks that seed 1 is still there,
  // untouched, and that saving seed 3 works.
  void expect_failed_save_contained(const std::string& job_prefix, const std::string& file,
                                    const std::string& errno_text, const std::string& action = "save") {
    probe_action_ = action;
    expect_contained(run_bounded(job_prefix + " " + probe_job(ckpt_, action, 2)), file, errno_text);
  }
  // The same for the output of a job that saved seed 2 over seed 1; both
  // ranks raise `error_class`.
  void expect_contained(const CommandResult& faulty, const std::string& file, const std::string& errno_text,
                        const std::string& error_class = "IoError") {
    EXPECT_EQ(faulty.exit_code, 1) << faulty.output;
    EXPECT_THAT(faulty.output, ContainsRegex("distckpt-launch: rank [01] exited with code 1"));
    for (const std::string rank : {"0", "1"}) {
      const std::vector<std::string> lines = lines_starting(faulty.output, "rank " + rank + " failed: ");
      ASSERT_THAT(lines, SizeIs(1)) << faulty.output;
      EXPECT_THAT(lines[0], HasSubstr("'" + file + "'"));
      EXPECT_THAT(lines[0], HasSubstr(errno_text));
    }
    // The same class on both ranks, the faulting one's and the other's.
    EXPECT_THAT(failure_classes(faulty.output, 2), Each(Eq(error_class))) << faulty.output;
    EXPECT_THAT(faulty.output, Not(HasSubstr("saved seed 2")));

    // Nothing of seed 2 committed or left behind; seed 1 as it was.
    const std::vector<std::string> left = list_dir(dir_);
    EXPECT_THAT(left, ElementsAre("ckpt"));
    const bool kept = digest(ckpt_) == seed1().digest_text;
    EXPECT_TRUE(kept);
    record_fault(fmt::format("{} of 2 ranks: {} on '{}'", probe_action_, errno_text, relative(file)),
                 fmt::format("{}; previous checkpoint {}; {} left beside it",
                             describe_classes(failure_classes(faulty.output, 2)),
                             kept ? "kept (same digest)" : "CHANGED", left.size() == 1 ? "nothing" : "something"));

    const CommandResult next = run_bounded(probe_job(ckpt_, "save", 3));
    EXPECT_EQ(next.exit_code, 0) << next.output;
    EXPECT_THAT(next.output, HasSubstr("rank 0 saved seed 3"));
    EXPECT_THAT(next.output, HasSubstr("rank 1 saved seed 3"));
    const std::string after = digest(ckpt_);
    EXPECT_THAT(after, HasSubstr("w float32 "));
    EXPECT_NE(after, seed1().digest_text);
  }

  std::string staging_file(const std::string& name) const { return dir_ + "/.ckpt.distckpt-staging/" + name; }
  // `path` below this test's directory, for the fault table.
  std::string relative(const std::string& path) const {
    return path.rfind(dir_ + "/", 0) == 0 ? path.substr(dir_.size() + 1) : path;
  }

  std::string probe_action_ = "async-save";  // the save expect_contained's job ran, for the fault table

  TempDir temp_{"io-fault"};
  // strace -P compares resolved paths.
  const std::string dir_ = canonical_path(temp_.path());
  const std::string ckpt_ = dir_ + "/ckpt";
};

TEST_F(IoFaultTest, NoSpaceOnDataWriteFailsEveryRankAndKeepsThePreviousCheckpoint) {
  const std::string file = staging_file("data/rank_00001.bin");
  const CommandResult faulty =
      run_bounded(strace_inject("pwrite64", file, "error=ENOSPC") + " " + probe_job(ckpt_, "save", 2));
  // Both ranks hold the same report as data: rank 1 failed, with ENOSPC on its file.
  for (const std::string rank : {"0", "1"}) {
    EXPECT_THAT(lines_starting(faulty.output, "rank " + rank + " report: "),
                ElementsAre(fmt::format("rank {} report: rank 1 IoError errno={} {}", rank, ENOSPC, file)))
        << faulty.output;
  }
  probe_action_ = "save";
  expect_contained(faulty, file, "No space left on device");
}

// Background staging returns before the data file exists everywhere: a rank
// that cannot create it, or write it, fails every rank at finalize instead.
TEST_F(IoFaultTest, BackgroundStagedSaveThatCannotCreateItsFileFailsEveryRankAtFinalize) {
  const std::string file = staging_file("data/rank_00001.bin");
  expect_failed_save_contained(strace_inject("openat", file, "error=EACCES"), file, "Permission denied", "async-save");
}

TEST_F(IoFaultTest, NoSpaceOnABackgroundStagedSaveFailsEveryRankAtFinalize) {
  const std::string file = staging_file("data/rank_00000.bin");
  expect_failed_save_contained(strace_inject("pwrite64", file, "error=ENOSPC"), file, "No space left on device",
                               "async-save");
}

// Rank 1 cannot start the thread that writes its data file (clone3 fails
// with EAGAIN, as at a thread limit): every rank fails at finalize, saying
// so and naming the file. Each thread rank 1 starts once the save has begun
// is failed in turn (which one is the writer's is not fixed); no step may
// hang.
TEST_F(IoFaultTest, ABackgroundStagedSaveThatCannotStartItsWriterFailsEveryRankAtFinalize) {
  const std::string file = staging_file("data/rank_00001.bin");
  const int before = threads_started_before(
      [&](const std::string& prefix) {
        return run_bounded(probe_job(ckpt_, "async-save", 1, "--io-threads 1", prefix));
      },
      1, dir_);
  ASSERT_GE(before, 0) << "rank 1 never touched " << dir_;
  bool reached = false;
  for (int when = before + 1; when <= before + 4 && !reached; ++when) {
    const CommandResult r =
        run_bounded(probe_job(ckpt_, "async-save", 2, "--io-threads 1", fail_thread_start_on_rank(1, when)));
    ASSERT_FALSE(ran_out(r)) << "the job hung with rank 1's thread start " << when << " failed:\n" << r.output;
    reached = r.output.find("could not start a thread for writing") != std::string::npos;
    if (reached) {
      expect_contained(r, file, "the process is at its thread limit", kThreadStartClass);
    } else {
      ASSERT_EQ(digest(ckpt_), seed1().digest_text) << "step " << when << " saved:\n" << r.output;
    }
  }
  EXPECT_TRUE(reached) << "no step failed the writer's thread";
}

// With two writer threads per rank, rank 1 starts one and not the other:
// the save goes on with the one, saying so (before, the vector of threads
// was destroyed with one running: std::terminate).
TEST_F(IoFaultTest, AWriterThreadThatCannotStartLeavesTheWorkToTheOther) {
  const auto job = [&](const std::string& prefix) {
    return run_bounded(probe_job(ckpt_, "save", 1, "--io-threads 2", prefix));
  };
  const int before = threads_started_before(job, 1, dir_);  // the checkpoint or its staging directory
  ASSERT_GE(before, 0) << "rank 1 never touched " << dir_;
  bool reached = false;
  for (int when = before + 1; when <= before + 4 && !reached; ++when) {
    const CommandResult r = job(fail_thread_start_on_rank(1, when));
    ASSERT_FALSE(ran_out(r)) << "the save hung with rank 1's thread start " << when << " failed:\n" << r.output;
    // (Failing the first writer thread fails the save on both ranks, saying why.)
    reached =
        r.output.find(
            "the process is at its thread limit or out of memory for thread stacks; raise the limit "
            "(ulimit -u, or the container's pids.max) or run fewer threads; going on with 1 of 2") != std::string::npos;
    if (reached) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_THAT(r.output, HasSubstr("rank 0 saved seed 1"));
      EXPECT_THAT(r.output, HasSubstr("rank 1 saved seed 1"));
    }
  }
  EXPECT_TRUE(reached) << "no step failed the second writer thread";
  EXPECT_EQ(digest(ckpt_), seed1().digest_text);
}

// A load whose reader thread cannot start on rank 1 fails on both ranks,
// saying why; each thread rank 1 starts once the load has begun is failed
// in turn, and no step may hang.
TEST_F(IoFaultTest, ALoadThatCannotStartItsReaderFailsEveryRank) {
  const auto job = [&](const std::string& prefix) { return run_bounded(probe_job(ckpt_, "load", 1, "", prefix)); };
  const int before = threads_started_before(job, 1, ckpt_);
  ASSERT_GE(before, 0) << "rank 1 never touched " << ckpt_;
  bool reached = false;
  for (int when = before + 1; when <= before + 4 && !reached; ++when) {
    const CommandResult r = job(fail_thread_start_on_rank(1, when));
    ASSERT_FALSE(ran_out(r)) << "the load hung with rank 1's thread start " << when << " failed:\n" << r.output;
    reached = r.output.find("could not start a thread for reading") != std::string::npos;
    if (!reached) continue;
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const std::string rank : {"0", "1"}) {
      const std::vector<std::string> lines = lines_starting(r.output, "rank " + rank + " failed: ");
      ASSERT_THAT(lines, SizeIs(1)) << r.output;
      EXPECT_THAT(lines[0], HasSubstr("the process is at its thread limit"));
    }
    EXPECT_THAT(failure_classes(r.output, 2), Each(Eq(kThreadStartClass))) << r.output;
    record_fault("load of 2 ranks: rank 1 cannot start its reader thread (clone3 EAGAIN)",
                 describe_classes(failure_classes(r.output, 2)));
  }
  EXPECT_TRUE(reached) << "no step failed the reader's thread";
}

TEST_F(IoFaultTest, EioOnDataWriteFailsEveryRankAndKeepsThePreviousCheckpoint) {
  const std::string file = staging_file("data/rank_00000.bin");
  expect_failed_save_contained(strace_inject("pwrite64", file, "error=EIO"), file, "Input/output error");
}

TEST_F(IoFaultTest, FailedFsyncOfDataFailsEveryRankAndKeepsThePreviousCheckpoint) {
  const std::string file = staging_file("data/rank_00001.bin");
  expect_failed_save_contained(strace_inject("fsync", file, "error=EIO"), file, "fsync '" + file + "' failed");
}

TEST_F(IoFaultTest, FailedWriteOfMetadataFailsEveryRankAndKeepsThePreviousCheckpoint) {
  const std::string file = staging_file("metadata.fb.tmp");
  expect_failed_save_contained(strace_inject("pwrite64", file, "error=EDQUOT"), file, "Disk quota exceeded");
}

TEST_F(IoFaultTest, FailedRenameOfCommitMarkerFailsEveryRankAndKeepsThePreviousCheckpoint) {
  const std::string file = staging_file("metadata.json.tmp");
  expect_failed_save_contained(strace_inject("rename,renameat,renameat2", file, "error=EIO"), file,
                               "Input/output error");
}

TEST_F(IoFaultTest, FailedExchangeIntoPlaceKeepsThePreviousCheckpoint) {
  // An overwrite swaps the new checkpoint in with one renameat2 (RENAME_EXCHANGE).
  const std::string staging = dir_ + "/.ckpt.distckpt-staging";
  expect_failed_save_contained(strace_inject("renameat2", staging, "error=ENOSPC"), staging,
                               "exchange of '" + staging + "' with '" + ckpt_ + "' failed: No space left on device");
}

TEST_F(IoFaultTest, FailedRenameIntoPlacePutsThePreviousCheckpointBack) {
  // Where the file system cannot exchange (EINVAL), the previous checkpoint
  // is moved aside before the new one moves in; the second rename failing
  // must move it back.
  const std::string staging = dir_ + "/.ckpt.distckpt-staging";
  const std::string job = strace_command() + " --seccomp-bpf -qq -o /dev/null -e trace=rename,renameat2 -P " +
                          shell_quote(staging) + " -e inject=renameat2:error=EINVAL -e inject=rename:error=ENOSPC";
  expect_failed_save_contained(job, staging,
                               "rename of '" + staging + "' to '" + ckpt_ + "' failed: No space left on device");
}

TEST_F(IoFaultTest, FailedFsyncAfterTheRenamesPutsThePreviousCheckpointBack) {
  // The renames are in place but not durable: the commit must be undone.
  expect_failed_save_contained(strace_inject("fsync", dir_, "error=EIO"), dir_,
                               "fsync of directory '" + dir_ + "' failed: Input/output error");
}

TEST_F(IoFaultTest, ShortWritesStillWriteACorrectCheckpoint) {
  // Every write into the staging directory moves at most 1000 bytes (not a
  // multiple of the O_DIRECT alignment either): the writer must loop. An
  // AddressSanitizer build would refuse a library preloaded before its runtime.
  const std::string preload = "env LD_PRELOAD=" DISTCKPT_BIN_DIR
                              "/../lib/distckpt_short_writes.so DISTCKPT_SHORT_WRITE_MATCH=.ckpt.distckpt-staging "
                              "DISTCKPT_SHORT_WRITE_BYTES=1000 "
                              "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0";
  const CommandResult saved = run_bounded(probe_job(ckpt_, "save", 7, "", preload));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::vector<std::string> reports = lines_starting(saved.output, "short_writes: ");
  ASSERT_THAT(reports, SizeIs(2)) << saved.output;
  for (const std::string& report : reports) EXPECT_THAT(report, ContainsRegex("^short_writes: [1-9][0-9]+ writes"));

  const CommandResult verified = run_bounded(DISTCKPT_BIN_DIR "/distckpt verify " + shell_quote(ckpt_));
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  const CommandResult loaded = run_bounded(probe_job(ckpt_, "load", 7));
  EXPECT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_THAT(loaded.output, HasSubstr("rank 0 loaded seed 7 bitwise-equal"));
  EXPECT_THAT(loaded.output, HasSubstr("rank 1 loaded seed 7 bitwise-equal"));
}

TEST_F(IoFaultTest, EioOnDataReadFailsTheLoadOnEveryRankNamingFileAndOffset) {
  // Rank 0's file holds its rows of "w" and the one copy of "bias", which
  // both ranks read.
  const std::string file = ckpt_ + "/data/rank_00000.bin";
  const CommandResult loaded =
      run_bounded(strace_inject("pread64", file, "error=EIO") + " " + probe_job(ckpt_, "load", 1));
  EXPECT_EQ(loaded.exit_code, 1) << loaded.output;
  for (const std::string rank : {"0", "1"}) {
    const std::vector<std::string> lines = lines_starting(loaded.output, "rank " + rank + " failed: ");
    ASSERT_THAT(lines, SizeIs(1)) << loaded.output;
    EXPECT_THAT(lines[0],
                ContainsRegex("read of [0-9]+ bytes at offset [0-9]+ from '" + file + "' failed: Input/output error"));
  }
  EXPECT_THAT(failure_classes(loaded.output, 2), Each(Eq("IoError"))) << loaded.output;
  record_fault("load of 2 ranks: EIO on every read of 'ckpt/data/rank_00000.bin'",
               describe_classes(failure_classes(loaded.output, 2)) + ", naming the file and the offset");
}

TEST_F(IoFaultTest, LoadWithoutRoomInSharedMemoryHasEachRankReadItsParts) {
  // Both ranks need "bias": one reads it and, on one host, hands it over
  // through /dev/shm. With no room there (every fallocate fails), the ranks
  // agree to each read their parts instead, and say so.
  const std::string job = strace_command() + " --seccomp-bpf -qq -o /dev/null -e trace=fallocate" +
                          " -e inject=fallocate:error=ENOSPC " + probe_job(ckpt_, "load", 1);
  const CommandResult loaded = run_bounded(job);
  EXPECT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_THAT(loaded.output, HasSubstr("rank 0 loaded seed 1 bitwise-equal"));
  EXPECT_THAT(loaded.output, HasSubstr("rank 1 loaded seed 1 bitwise-equal"));
  EXPECT_THAT(loaded.output, ContainsRegex("each read the pieces they share instead of reading them once into shared "
                                           "memory: rank [01]: cannot reserve [0-9]+ bytes of shared memory in "
                                           "/dev/shm \\(No space left on device\\)"));
}

// A real full file system: an 8 MiB tmpfs and a 24 MiB checkpoint.
TEST(DiskFullTest, SaveLargerThanTheFileSystemFailsEveryRankAndKeepsThePreviousCheckpoint) {
  TempDir temp("disk-full");
  const std::string mnt = temp.file("mnt");
  ASSERT_EQ(run_command("mkdir " + shell_quote(mnt)).exit_code, 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=8m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs at " << mnt << " (" << std::strerror(errno)
                 << "); this test needs root with CAP_SYS_ADMIN";
  }
  // Unmounted however the test ends; lazily, in case a rank still holds a file.
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string ckpt = mnt + "/ckpt";

  const CommandResult first = run_bounded(probe_job(ckpt, "save", 1, "--mb 2"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string before = digest(ckpt);
  ASSERT_THAT(before, HasSubstr("w float32 ")) << before;

  const CommandResult full = run_bounded(probe_job(ckpt, "save", 2, "--mb 24"));
  EXPECT_EQ(full.exit_code, 1) << full.output;
  for (const std::string rank : {"0", "1"}) {
    const std::vector<std::string> lines = lines_starting(full.output, "rank " + rank + " failed: ");
    ASSERT_THAT(lines, SizeIs(1)) << full.output;
    EXPECT_THAT(lines[0], ContainsRegex("'" + mnt +
                                        "/.ckpt.distckpt-staging/data/rank_0000[01].bin' failed: No "
                                        "space left on device"));
  }
  EXPECT_THAT(failure_classes(full.output, 2), Each(Eq("IoError"))) << full.output;
  record_fault("save of 2 ranks into a full 8 MiB tmpfs (24 MiB checkpoint)",
               describe_classes(failure_classes(full.output, 2)) + " (No space left on device)");
  EXPECT_THAT(list_dir(mnt), ElementsAre("ckpt"));
  EXPECT_EQ(digest(ckpt), before);

  const CommandResult next = run_bounded(probe_job(ckpt, "save", 3, "--mb 2"));
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_NE(digest(ckpt), before);
}

}  // namespace
