// io layer: File, atomic writes, directory helpers, safe_join, checksums.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "distckpt/core/errors.h"
#include "io/checksum.h"
#include "io/file.h"
#include "io/staging.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt::io {
namespace {

mode_t current_umask() {
  const mode_t mask = ::umask(0);  // the only way to read it is to set it
  ::umask(mask);
  return mask;
}

void write_text(const std::string& path, const std::string& text) {
  File f(path, File::Mode::kCreateTruncate);
  f.pwrite_all(text.data(), text.size(), 0);
}

TEST(IoFileTest, PwriteThenPreadAtOffsets) {
  TempDir dir("io");
  const std::string path = dir.file("data.bin");
  {
    File f(path, File::Mode::kCreateTruncate);
    EXPECT_TRUE(f.is_open());
    EXPECT_EQ(f.path(), path);
    f.pwrite_all("hello", 5, 0);
    f.pwrite_all("world", 5, 100);
    f.sync();
    EXPECT_EQ(f.size(), 105u);
    f.close();
    EXPECT_FALSE(f.is_open());
  }
  File f(path, File::Mode::kRead);
  std::string head(5, '?'), tail(5, '?'), gap(3, '?');
  f.pread_all(head.data(), head.size(), 0);
  f.pread_all(tail.data(), tail.size(), 100);
  f.pread_all(gap.data(), gap.size(), 50);
  EXPECT_EQ(head, "hello");
  EXPECT_EQ(tail, "world");
  EXPECT_EQ(gap, std::string(3, '\0'));  // a hole reads as zeros
  EXPECT_EQ(file_size(path), 105u);
}

TEST(IoFileTest, ReadPastEndIsCorruptionWithOffsetsInMessage) {
  TempDir dir("io");
  const std::string path = dir.file("short.bin");
  write_text(path, "0123456789");
  File f(path, File::Mode::kRead);
  char buffer[8];
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { f.pread_all(buffer, sizeof(buffer), 5); },
                                   "unexpected end of file " + path + " at offset 5 (wanted 8 bytes, file has 10)"));
  // Reading exactly up to the end is fine.
  f.pread_all(buffer, 5, 5);
  EXPECT_EQ(std::string(buffer, 5), "56789");
}

TEST(IoFileTest, OpenMissingFileNamesPathAndErrno) {
  TempDir dir("io");
  const std::string path = dir.file("absent.bin");
  EXPECT_TRUE(throws_with<IoError>([&] { File f(path, File::Mode::kRead); }, path));
  EXPECT_TRUE(throws_with<IoError>([&] { File f(path, File::Mode::kRead); }, "No such file or directory"));
}

// A checkpoint is untrusted: a FIFO in it must not block the reader until
// some writer opens it, nor a directory pass for a file.
TEST(IoFileTest, ReadingAFifoOrADirectoryIsRefusedAtOnce) {
  TempDir dir("io");
  const std::string fifo = dir.file("metadata.fb");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { File f(fifo, File::Mode::kRead); },
                                           "'" + fifo +
                                               "' is not a regular file (a FIFO); distckpt reads checkpoints from "
                                               "regular files only"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { read_file(fifo, 100); }, "(a FIFO)"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { File f(dir.path(), File::Mode::kRead); },
                                           "is not a regular file (a directory)"));
  // A regular file reads as before, blocking reads and all.
  write_text(dir.file("plain"), "abc");
  EXPECT_EQ(read_file(dir.file("plain"), 100), "abc");
}

// Links are followed within the checkpoint only, whether the file or a
// folder on its way is the link.
TEST(IoFileTest, CheckInsideAcceptsLinksThatStayInTheCheckpointOnly) {
  TempDir dir("io");
  const std::string ckpt = dir.file("ckpt"), outside = dir.file("outside");
  make_dirs(ckpt + "/data");
  make_dirs(outside);
  write_text(ckpt + "/data/a.bin", "a");
  write_text(outside + "/b.bin", "b");
  check_inside(ckpt, ckpt + "/data/a.bin");
  ASSERT_EQ(::symlink("a.bin", (ckpt + "/data/inside.bin").c_str()), 0);
  check_inside(ckpt, ckpt + "/data/inside.bin");
  ASSERT_EQ(::symlink((outside + "/b.bin").c_str(), (ckpt + "/data/out.bin").c_str()), 0);
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { check_inside(ckpt, ckpt + "/data/out.bin"); },
      ckpt + "/data/out.bin resolves to " + std::filesystem::canonical(outside).string() +
          "/b.bin, outside the checkpoint " + ckpt +
          "; distckpt does not follow links out of a checkpoint: copy the files into it (cp -L)"));
  ASSERT_EQ(::symlink(outside.c_str(), (ckpt + "/linked").c_str()), 0);
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { check_inside(ckpt, ckpt + "/linked/b.bin"); }, "outside the checkpoint"));
  // The checkpoint itself may be reached through a link.
  ASSERT_EQ(::symlink(ckpt.c_str(), dir.file("alias").c_str()), 0);
  check_inside(dir.file("alias"), dir.file("alias") + "/data/a.bin");
}

// open_inside checks the file it opened, not the name: a link swapped in
// after an earlier check by name is still refused.
TEST(IoFileTest, OpenInsideChecksTheOpenedFileNotTheName) {
  TempDir dir("io");
  const std::string ckpt = dir.file("ckpt"), outside = dir.file("outside.bin");
  make_dirs(ckpt);
  write_text(ckpt + "/a.bin", "inside");
  write_text(outside, "secret");
  EXPECT_EQ(read_file_inside(ckpt, ckpt + "/a.bin", 100), "inside");
  check_inside(ckpt, ckpt + "/a.bin");  // a reader's early check passes...
  ASSERT_EQ(::rename((ckpt + "/a.bin").c_str(), (ckpt + "/old.bin").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (ckpt + "/a.bin").c_str()), 0);  // ...then the name changes
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { open_inside(ckpt, ckpt + "/a.bin"); },
      "resolves to " + std::filesystem::canonical(outside).string() + ", outside the checkpoint " + ckpt));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { read_file_inside(ckpt, ckpt + "/a.bin", 100); }, "outside"));
}

// A Hugging Face hub cache keeps a snapshot's files as links into the
// repository's blobs folder; those (and only those) are part of it.
TEST(IoFileTest, HubSnapshotLinksIntoItsOwnBlobsOnly) {
  TempDir dir("io");
  const std::string repo = dir.file("models--org--m"), other = dir.file("models--org--other");
  const std::string snapshot = repo + "/snapshots/0123abc";
  make_dirs(snapshot);
  make_dirs(repo + "/blobs");
  make_dirs(other + "/blobs");
  write_text(repo + "/blobs/f00d", "weights");
  write_text(other + "/blobs/beef", "other");
  ASSERT_EQ(::symlink("../../blobs/f00d", (snapshot + "/model.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink((other + "/blobs/beef").c_str(), (snapshot + "/stolen.safetensors").c_str()), 0);
  check_inside(snapshot, snapshot + "/model.safetensors");
  EXPECT_EQ(read_file_inside(snapshot, snapshot + "/model.safetensors", 100), "weights");
  EXPECT_TRUE(throws_with<CorruptionError>([&] { check_inside(snapshot, snapshot + "/stolen.safetensors"); },
                                           "outside the checkpoint"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { open_inside(snapshot, snapshot + "/stolen.safetensors"); },
                                           "outside the checkpoint"));
  // A folder of a snapshot (a pipeline's text_encoder/) links three levels up.
  make_dirs(snapshot + "/text_encoder");
  ASSERT_EQ(::symlink("../../../blobs/f00d", (snapshot + "/text_encoder/model.safetensors").c_str()), 0);
  EXPECT_EQ(read_file_inside(snapshot + "/text_encoder", snapshot + "/text_encoder/model.safetensors", 100), "weights");
  // A folder merely named like one is no snapshot of a repository with blobs.
  const std::string lone = dir.file("snapshots/rev");
  make_dirs(lone);
  ASSERT_EQ(::symlink((repo + "/blobs/f00d").c_str(), (lone + "/m.safetensors").c_str()), 0);
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { check_inside(lone, lone + "/m.safetensors"); }, "outside the checkpoint"));
}

TEST(IoFileTest, CreateTruncatesAndMoveTransfersOwnership) {
  TempDir dir("io");
  const std::string path = dir.file("f.bin");
  write_text(path, "0123456789");
  File a(path, File::Mode::kCreateTruncate);
  EXPECT_EQ(a.size(), 0u);
  const int fd = a.fd();
  File b(std::move(a));
  EXPECT_FALSE(a.is_open());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.fd(), fd);
  File c;
  c = std::move(b);
  EXPECT_EQ(c.fd(), fd);
  c.pwrite_all("x", 1, 0);
  EXPECT_EQ(c.size(), 1u);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644 & ~current_umask());
}

TEST(IoFileTest, AtomicWriteReplacesContentAndLeavesNoTemp) {
  TempDir dir("io");
  const std::string path = dir.file("metadata.json");
  write_file_atomic(path, "old");
  EXPECT_EQ(read_file(path, 100), "old");
  write_file_atomic(path, "new content");
  EXPECT_EQ(read_file(path, 100), "new content");
  EXPECT_FALSE(exists(path + ".tmp"));
  write_file_atomic(path, "");
  EXPECT_EQ(read_file(path, 100), "");
}

TEST(IoFileTest, RenameNoReplaceKeepsATargetThatExists) {
  TempDir dir("io");
  write_text(dir.file("new"), "new");
  write_text(dir.file("theirs"), "theirs");
  EXPECT_TRUE(throws_with<CheckpointError>([&] { rename_no_replace(dir.file("new"), dir.file("theirs")); },
                                           "'" + dir.file("theirs") + "' appeared while it was being written"));
  EXPECT_EQ(read_file(dir.file("theirs"), 100), "theirs");
  // A directory onto an empty one (which rename(2) would replace): refused.
  make_dirs(dir.file("staged"));
  write_text(dir.file("staged/model.safetensors"), "ours");
  make_dirs(dir.file("empty"));
  EXPECT_TRUE(throws_with<CheckpointError>([&] { rename_no_replace(dir.file("staged"), dir.file("empty")); },
                                           "appeared while it was being written"));
  EXPECT_TRUE(is_empty_dir(dir.file("empty")));
  rename_no_replace(dir.file("new"), dir.file("free"));
  EXPECT_EQ(read_file(dir.file("free"), 100), "new");
}

// A second writer of a target is refused while the first holds the lock
// (the kernel lock conflicts between two opens, even in one process); the
// lock file goes with the holder; a link in its place is not followed.
TEST(IoStagingTest, OneWriterAtATimeAndNothingLeftAfter) {
  TempDir dir("io");
  const StagingPaths paths = staging_paths(dir.file("ckpt/"));
  EXPECT_EQ(paths.lock, dir.file(".ckpt.distckpt-lock"));
  {
    const StagingLock held(paths);
    EXPECT_TRUE(exists(paths.lock));
    EXPECT_TRUE(throws_with<CheckpointError>(
        [&] { StagingLock second(paths); },
        "another save or export is writing '" + paths.target + "' (it holds '" + paths.lock + "')"));
  }
  EXPECT_FALSE(exists(paths.lock));
  { const StagingLock again(paths); }
  EXPECT_TRUE(is_empty_dir(dir.path()));

  ASSERT_EQ(::symlink(dir.file("elsewhere").c_str(), paths.lock.c_str()), 0);
  EXPECT_TRUE(throws_with<IoError>([&] { StagingLock linked(paths); }, "cannot create the lock file"));
  EXPECT_FALSE(exists(dir.file("elsewhere")));

  // The error names what the user can fix: the folder, not the lock file.
  const StagingPaths nowhere = staging_paths(dir.file("nodir/w.pt"));
  EXPECT_TRUE(throws_with<IoError>(
      [&] { StagingLock missing(nowhere); },
      "cannot write '" + dir.file("nodir/w.pt") + "': the folder '" + dir.file("nodir") + "' does not exist"));
}

TEST(IoFileTest, AtomicWriteIntoMissingDirectoryFails) {
  TempDir dir("io");
  EXPECT_TRUE(throws_with<IoError>([&] { write_file_atomic(dir.file("no/such/dir/x"), "x"); }, "no/such/dir/x.tmp"));
}

TEST(IoFileTest, ReadFileRefusesFilesAboveTheLimit) {
  TempDir dir("io");
  const std::string path = dir.file("big.json");
  write_text(path, std::string(11, 'x'));
  EXPECT_EQ(read_file(path, 11).size(), 11u);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { read_file(path, 10); }, path + " is 11 bytes, more than the 10"));
}

TEST(IoDirTest, MakeDirsCreatesEveryLevelAndIsIdempotent) {
  TempDir dir("io");
  const std::string deep = dir.file("a/b/c");
  make_dirs(deep);
  EXPECT_TRUE(is_dir(dir.file("a")));
  EXPECT_TRUE(is_dir(deep));
  make_dirs(deep);  // already there
  make_dirs(deep + "/");
  write_text(dir.file("file"), "x");
  EXPECT_TRUE(throws_with<IoError>([&] { make_dirs(dir.file("file/sub")); }, dir.file("file")));
  EXPECT_TRUE(throws_with<UsageError>([&] { make_dirs(""); }, "empty"));
}

TEST(IoDirTest, ExistsIsDirAndIsEmptyDir) {
  TempDir dir("io");
  EXPECT_TRUE(exists(dir.path()));
  EXPECT_FALSE(exists(dir.file("absent")));
  EXPECT_FALSE(exists(dir.file("absent/deeper")));
  EXPECT_TRUE(is_empty_dir(dir.path()));
  EXPECT_TRUE(is_empty_dir(dir.file("absent")));
  write_text(dir.file("f"), "x");
  EXPECT_FALSE(is_empty_dir(dir.path()));
  EXPECT_FALSE(is_empty_dir(dir.file("f")));  // a file is not an empty directory
  EXPECT_FALSE(is_dir(dir.file("f")));
  EXPECT_TRUE(throws_with<IoError>([&] { file_size(dir.file("absent")); }, dir.file("absent")));
}

TEST(IoDirTest, RemoveTreeDeletesNestedContentButNeverFollowsLinks) {
  TempDir dir("io");
  TempDir outside("io-outside");
  write_text(outside.file("keep.txt"), "precious");
  const std::string root = dir.file("ckpt");
  make_dirs(root + "/data/deeper");
  write_text(root + "/data/rank_0.bin", "abc");
  write_text(root + "/data/deeper/x", "x");
  write_text(root + "/metadata.json", "{}");
  ASSERT_EQ(::symlink(outside.path().c_str(), (root + "/data/link_to_dir").c_str()), 0);
  ASSERT_EQ(::symlink(outside.file("keep.txt").c_str(), (root + "/link_to_file").c_str()), 0);

  remove_tree(root);
  EXPECT_FALSE(exists(root));
  EXPECT_EQ(read_file(outside.file("keep.txt"), 100), "precious");
  EXPECT_TRUE(is_dir(outside.path()));

  remove_tree(root);  // absent: no error
  write_text(dir.file("plain"), "x");
  remove_tree(dir.file("plain"));  // a single file
  EXPECT_FALSE(exists(dir.file("plain")));
}

TEST(IoSafeJoinTest, AcceptsRelativePaths) {
  EXPECT_EQ(safe_join("/ckpt", "data/rank_0.bin"), "/ckpt/data/rank_0.bin");
  EXPECT_EQ(safe_join("/ckpt/", "data/rank_0.bin"), "/ckpt/data/rank_0.bin");
  EXPECT_EQ(safe_join("", "common.fb"), "common.fb");
  EXPECT_EQ(safe_join("ckpt", "a\\b"), "ckpt/a\\b");  // only '/' separates components
  EXPECT_EQ(safe_join("ckpt", "..a/b..c/...d"), "ckpt/..a/b..c/...d");
  EXPECT_EQ(safe_join("ckpt", std::string(4096, 'x')).size(), 5u + 4096u);
  validate_relative_path("data/rank_0.bin");
}

TEST(IoSafeJoinTest, RejectsEachUnsafeForm) {
  const struct {
    std::string path;
    std::string reason;
  } cases[] = {
      {"", "the path is empty"},
      {"/etc/passwd", "absolute paths are not allowed"},
      {"..", "'..' components are not allowed"},
      {"../x", "'..' components are not allowed"},
      {"a/../../b", "'..' components are not allowed"},
      {"a/..", "'..' components are not allowed"},
      {".", "'.' components are not allowed"},
      {"./a", "'.' components are not allowed"},
      {"a/./b", "'.' components are not allowed"},
      {"a//b", "it has an empty component"},
      {"a/", "it has an empty component"},
      {std::string("a\0b", 3), "it contains a NUL byte"},
      {std::string(4097, 'x'), "longer than 4096 bytes"},
  };
  for (const auto& c : cases) {
    EXPECT_TRUE(throws_with<CorruptionError>([&] { safe_join("/ckpt", c.path); }, c.reason)) << c.path.size();
    EXPECT_TRUE(throws_with<CorruptionError>([&] { validate_relative_path(c.path); }, "unsafe path '"));
  }
  EXPECT_TRUE(throws_with<CorruptionError>([] { safe_join("/ckpt", "../escape.bin"); },
                                           "unsafe path '../escape.bin' in checkpoint metadata: "));
  // Control bytes are escaped in the message.
  EXPECT_TRUE(throws_with<CorruptionError>([] { safe_join("/ckpt", std::string("a\0b", 3)); }, "'a\\x00b'"));
}

TEST(IoChecksumTest, KnownAnswers) {
  // Documented by xxHash: XXH3_64bits of the empty input.
  EXPECT_EQ(xxh3("", 0), 0x2d06800538d394c2ull);
  EXPECT_EQ(hex64(xxh3("", 0)), "2d06800538d394c2");
  // Pinned once from xxHash 0.8.1; XXH3's output is frozen since 0.8.0, so a
  // change here means checkpoints written earlier would fail verification.
  EXPECT_EQ(hex64(xxh3("distckpt", 8)), "bc24ebfee2cbe45d");
  EXPECT_EQ(hex64(1), "0000000000000001");
  EXPECT_EQ(hex64(~uint64_t{0}), "ffffffffffffffff");
}

TEST(IoChecksumTest, BlockSplittingCountsAndValues) {
  const std::string data = "0123456789";
  EXPECT_TRUE(block_checksums(data.data(), 0, 4).empty());
  const auto three = block_checksums(data.data(), 10, 4);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0], xxh3("0123", 4));
  EXPECT_EQ(three[1], xxh3("4567", 4));
  EXPECT_EQ(three[2], xxh3("89", 2));  // the last block is shorter
  EXPECT_EQ(block_checksums(data.data(), 8, 4).size(), 2u);
  EXPECT_EQ(block_checksums(data.data(), 3, 4).size(), 1u);
  EXPECT_EQ(block_checksums(data.data(), 10, 10).size(), 1u);
  EXPECT_EQ(block_checksums(data.data(), 10, 1).size(), 10u);
  EXPECT_EQ(block_checksums(data.data(), 10, kDefaultChecksumBlock), std::vector<uint64_t>{xxh3(data.data(), 10)});
  EXPECT_TRUE(throws_with<UsageError>([&] { block_checksums(data.data(), 10, 0); }, "block size must be positive"));
}

TEST(IoChecksumTest, CombineHashesTheLittleEndianBlockSums) {
  const std::vector<uint64_t> blocks = {0x0102030405060708ull, 0x1122334455667788ull};
  const unsigned char le[16] = {8, 7, 6, 5, 4, 3, 2, 1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
  EXPECT_EQ(combine_block_checksums(blocks), xxh3(le, sizeof(le)));
  EXPECT_EQ(combine_block_checksums({}), 0x2d06800538d394c2ull);
  EXPECT_NE(combine_block_checksums({blocks[1], blocks[0]}), combine_block_checksums(blocks));
}

TEST(IoChecksumTest, StreamingMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 5000; ++i) data += static_cast<char>(i * 31 % 251);
  StreamingHash hash;
  EXPECT_EQ(hash.digest(), 0x2d06800538d394c2ull);
  hash.update(data.data(), 1);
  hash.update(data.data() + 1, 999);
  hash.update(data.data() + 1000, 0);
  hash.update(data.data() + 1000, data.size() - 1000);
  EXPECT_EQ(hash.digest(), xxh3(data.data(), data.size()));
  EXPECT_EQ(hash.digest(), hash.digest());  // digest does not consume the state
}

}  // namespace
}  // namespace distckpt::io
