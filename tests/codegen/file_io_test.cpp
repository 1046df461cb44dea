// Writing the generated files: through temporary files renamed into place,
// untouched when unchanged, and errors that name the path and the OS error.
#include "file_io.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace distckpt::gen {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("distckpt_gen_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }

  std::string read(const fs::path& path) {
    std::string error;
    return read_file(path, error).value_or("<" + error + ">");
  }
  size_t entries() { return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {})); }

  fs::path dir_;
};

TEST_F(FileIo, WritesNewFilesAndReplacesChangedOnes) {
  EXPECT_EQ(write_files({{dir_ / "a.h", "one"}, {dir_ / "a.cpp", "two"}}), "");
  EXPECT_EQ(read(dir_ / "a.h"), "one");
  EXPECT_EQ(read(dir_ / "a.cpp"), "two");
  EXPECT_EQ(write_files({{dir_ / "a.h", "three"}}), "");
  EXPECT_EQ(read(dir_ / "a.h"), "three");
  EXPECT_EQ(entries(), 2u);  // no temporary file left behind
}

TEST_F(FileIo, LeavesUnchangedFilesAlone) {
  ASSERT_EQ(write_files({{dir_ / "a.h", "same"}}), "");
  struct stat before {};
  ASSERT_EQ(::stat((dir_ / "a.h").c_str(), &before), 0);
  ASSERT_EQ(write_files({{dir_ / "a.h", "same"}}), "");
  struct stat after {};
  ASSERT_EQ(::stat((dir_ / "a.h").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // not replaced: builds stay incremental
}

TEST_F(FileIo, AFailedReplacementNamesThePathAndLeavesNoTemporaryFile) {
  fs::create_directory(dir_ / "a.h");  // a directory where the header goes
  const std::string error = write_files({{dir_ / "a.h", "header"}});
  EXPECT_EQ(error, "cannot replace " + (dir_ / "a.h").string() + ": Is a directory");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(FileIo, AnOutputDirectoryUnderAFileIsAClearError) {
  std::ofstream(dir_ / "file") << "x";
  EXPECT_EQ(make_output_dir(dir_ / "file" / "out"),
            "cannot create the output directory " + (dir_ / "file" / "out").string() + ": Not a directory");
}

TEST_F(FileIo, AnUnwritableDirectoryIsAClearErrorAndNothingIsReplaced) {
  ASSERT_EQ(write_files({{dir_ / "a.h", "old"}}), "");
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(dir_.c_str(), W_OK) == 0) GTEST_SKIP() << "this user writes into read-only directories (root)";
  EXPECT_EQ(write_files({{dir_ / "a.h", "new"}, {dir_ / "a.cpp", "new"}}),
            "cannot create a temporary file in " + dir_.string() + ": Permission denied");
  EXPECT_EQ(read(dir_ / "a.h"), "old");
}

// The same failure for any user (root included): the second output's
// directory is a regular file, so nothing can be created there.
TEST_F(FileIo, AnOutputInsideAFileIsAClearErrorAndNothingIsReplaced) {
  ASSERT_EQ(write_files({{dir_ / "a.h", "old"}}), "");
  std::ofstream(dir_ / "not_a_dir") << "x";
  EXPECT_EQ(write_files({{dir_ / "a.h", "new"}, {dir_ / "not_a_dir" / "a.cpp", "new"}}),
            "cannot create a temporary file in " + (dir_ / "not_a_dir").string() + ": Not a directory");
  EXPECT_EQ(read(dir_ / "a.h"), "old");
}

TEST_F(FileIo, AMissingSchemaIsAClearError) {
  std::string error;
  EXPECT_FALSE(read_file(dir_ / "missing.shard", error));
  EXPECT_EQ(error, "cannot read " + (dir_ / "missing.shard").string() + ": No such file or directory");
}

}  // namespace
}  // namespace distckpt::gen
