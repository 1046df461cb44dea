// POSIX file primitives with full-length loops, fsync and atomic replace.
// A failed system call throws distckpt::IoError with the path and errno (its text
// in the message); a file shorter than a read needs throws CorruptionError.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/unique_fd.h"

namespace distckpt::io {

class File {
 public:
  enum class Mode { kRead, kCreateTruncate, kUpdate };  // kUpdate: an existing file, read-write
  File() = default;
  File(const std::string& path, Mode mode);
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Alignment that O_DIRECT transfers need (buffer address, offset, length);
  // 4 KiB covers every common logical block size.
  static constexpr uint64_t kDirectAlignment = 4096;
  // Switches the open file to O_DIRECT (page cache bypassed); false when the
  // file system does not support it (tmpfs, some FUSE), the file unchanged.
  bool try_enable_direct();
  bool is_direct() const { return direct_.load(); }

  // Writes/reads exactly n bytes at `offset` (loops over short transfers).
  // A direct write the kernel refuses as misaligned (EINVAL) is retried
  // buffered and the file stays buffered.
  void pwrite_all(const void* data, size_t n, uint64_t offset);
  void pread_all(void* data, size_t n, uint64_t offset) const;  // throws on EOF
  // Reads consecutive bytes from `offset` into the buffers of `iov` in order
  // (preadv, at most IOV_MAX buffers a call, short reads continued); `iov`
  // is consumed. Throws like pread_all.
  void preadv_all(std::vector<struct iovec>& iov, uint64_t offset) const;
  uint64_t size() const;
  void resize(uint64_t size);  // ftruncate: a longer file reads as zeros until written
  void sync();                 // fsync
  void close();
  bool is_open() const { return fd_.valid(); }
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }

 private:
  void disable_direct();

  UniqueFd fd_;
  std::string path_;
  std::atomic<bool> direct_{false};  // writer threads share one File
};

// Writes `bytes` to `path` via "<path>.tmp", fsync, rename, fsync of the
// directory: readers see the old file or the new one, never a torn one.
void write_file_atomic(const std::string& path, std::string_view bytes);
std::string read_file(const std::string& path, uint64_t max_bytes);  // throws if larger
std::string read_all(const File& file, uint64_t max_bytes);          // from offset 0; throws if larger
void rename_path(const std::string& from, const std::string& to);    // rename(2), errors name both
// rename(2) that never replaces: CheckpointError when `to` exists (it may
// have appeared since it was checked), leaving it as it is.
void rename_no_replace(const std::string& from, const std::string& to);
// Renames the directory `from` to `to`, which may be absent or an empty
// directory (made with mkdir before an export, replaced atomically);
// CheckpointError, `to` untouched, when anything else is there.
void rename_into_empty(const std::string& from, const std::string& to);
void fsync_dir(const std::string& dir);
// Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE): at every
// instant each name holds one of the two. False, with nothing changed, where
// the file system cannot; throws for any other failure.
bool exchange_paths(const std::string& a, const std::string& b);
void make_dirs(const std::string& dir);
void remove_tree(const std::string& path);  // no error if absent
// The names in directory `path` ("." and ".." left out), sorted; IoError
// naming the directory when it cannot be read.
std::vector<std::string> list_dir(const std::string& path);
bool exists(const std::string& path);
bool lexists(const std::string& path);  // also a symbolic link, even one to nothing
bool is_dir(const std::string& path);
bool is_regular_file(const std::string& path);  // following links; false when absent
// Throws CorruptionError saying what `path` is when it exists and is not a
// regular file (a FIFO, a device, a directory).
void require_regular_file(const std::string& path);
bool is_empty_dir(const std::string& path);   // true also when absent
bool holds_nothing(const std::string& path);  // absent, or an empty directory that is not a link
uint64_t file_size(const std::string& path);

// Joins a relative path from untrusted metadata to `dir`; throws
// CorruptionError for absolute paths, "..", empty components or NUL.
std::string safe_join(const std::string& dir, std::string_view relative);
// The check safe_join applies, for validating metadata without a directory.
void validate_relative_path(std::string_view relative);
// Throws CorruptionError unless `path`, an existing file of the checkpoint
// `dir`, resolves inside `dir`: a symbolic link (the file's or a folder's on
// its way) is followed only within the checkpoint (or, for a Hugging Face hub
// snapshot <repo>/snapshots/<revision>, into <repo>/blobs).
void check_inside(const std::string& dir, const std::string& path);
// Opens `path` of the checkpoint `dir` for reading and applies check_inside's
// rule to the opened file itself, so a link swapped in after an earlier
// check cannot redirect the read.
File open_inside(const std::string& dir, const std::string& path);
std::string read_file_inside(const std::string& dir, const std::string& path, uint64_t max_bytes);

}  // namespace distckpt::io
