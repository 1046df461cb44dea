// POSIX file primitives. Every loop here exists because the kernel may
// transfer fewer bytes than asked (large requests, signals) and every failure
// names the path and the errno text, because "I/O error" alone helps nobody.
#include "io/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE, RENAME_NOREPLACE
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "distckpt/core/errors.h"
#include "io/unique_fd.h"

namespace distckpt::io {
namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw IoError(fmt::format("{} '{}' failed: {}", what, path, std::strerror(err)), path, err);
}

// open(2) may be interrupted on network file systems; retry like read/write.
UniqueFd open_retrying(const char* path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return UniqueFd(fd);
}

void check_range(const std::string& path, size_t n, uint64_t offset) {
  constexpr auto kMaxOffset = static_cast<uint64_t>(std::numeric_limits<off_t>::max());
  if (offset > kMaxOffset || n > kMaxOffset - offset) {
    throw UsageError(
        fmt::format("byte range at offset {} of {} bytes in '{}' exceeds the largest file offset", offset, n, path),
        path);
  }
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The names in the open directory `dir_fd` ("." and ".." left out), sorted.
std::vector<std::string> names_in(int dir_fd, const std::string& dir_path) {
  UniqueFd iter_fd(::dup(dir_fd));
  if (!iter_fd.valid()) throw_errno("dup of directory", dir_path, errno);
  DIR* dir = ::fdopendir(iter_fd.get());
  if (dir == nullptr) throw_errno("opendir", dir_path, errno);
  iter_fd.release();  // the DIR owns it now; closedir closes it
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int read_err = errno;
  ::closedir(dir);
  if (read_err != 0) throw_errno("readdir", dir_path, read_err);
  std::sort(names.begin(), names.end());
  return names;
}

// Removes everything below the open directory `dir_fd`. Works on names
// relative to directory descriptors and never follows a symlink, so a link
// inside the tree cannot make it delete files outside the tree.
void remove_children(int dir_fd, const std::string& dir_path) {
  for (const auto& name : names_in(dir_fd, dir_path)) {
    const std::string child_path = dir_path + "/" + name;
    if (::unlinkat(dir_fd, name.c_str(), 0) == 0 || errno == ENOENT) continue;
    const int unlink_err = errno;
    // Linux says EISDIR for a directory, POSIX allows EPERM.
    if (unlink_err != EISDIR && unlink_err != EPERM) throw_errno("unlink", child_path, unlink_err);
    // O_NOFOLLOW makes sure it really is a directory and not a link to one.
    const UniqueFd child(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!child.valid()) throw_errno("unlink", child_path, errno == ENOTDIR ? unlink_err : errno);
    remove_children(child.get(), child_path);
    if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      throw_errno("rmdir", child_path, errno);
    }
  }
}

CorruptionError not_regular(const std::string& path, mode_t mode) {
  return CorruptionError(
      fmt::format("'{}' is not a regular file ({}); distckpt reads checkpoints from regular files only", path,
                  S_ISDIR(mode)    ? "a directory"
                  : S_ISFIFO(mode) ? "a FIFO"
                                   : "a device or socket"),
      path);
}

}  // namespace

void require_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) throw not_regular(path, st.st_mode);
}

File::File(const std::string& path, Mode mode) : path_(path) {
  // Writers open read-write so that a writer can read back what it wrote.
  // Reads open without blocking: a FIFO in a checkpoint (which is untrusted)
  // would otherwise block the open until some writer appears. It is refused
  // below; regular files ignore the flag.
  const int flags = mode == Mode::kRead     ? O_RDONLY | O_NONBLOCK | O_CLOEXEC
                    : mode == Mode::kUpdate ? O_RDWR | O_CLOEXEC
                                            : O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  fd_ = open_retrying(path.c_str(), flags, 0644);
  if (!fd_.valid() && mode == Mode::kRead && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    // A regular file under a lease (or on a tiered file system) answers a
    // non-blocking open so: open it as usual, the wait is the caller's.
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      fd_ = open_retrying(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  }
  if (!fd_.valid()) {
    throw_errno(mode == Mode::kRead     ? "open for reading"
                : mode == Mode::kUpdate ? "open for writing"
                                        : "create",
                path, errno);
  }
  if (mode != Mode::kRead) return;
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) throw_errno("stat", path, errno);
  if (!S_ISREG(st.st_mode)) throw not_regular(path, st.st_mode);
  const int status = ::fcntl(fd_.get(), F_GETFL);
  if (status < 0 || ::fcntl(fd_.get(), F_SETFL, status & ~O_NONBLOCK) != 0) throw_errno("fcntl", path, errno);
}

// Errors of an implicit close cannot be reported; close() reports them.
File::~File() = default;

File::File(File&& other) noexcept
    : fd_(std::move(other.fd_)), path_(std::move(other.path_)), direct_(other.direct_.load()) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    fd_ = std::move(other.fd_);
    path_ = std::move(other.path_);
    direct_ = other.direct_.load();
  }
  return *this;
}

bool File::try_enable_direct() {
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd_.get(), F_SETFL, flags | O_DIRECT) != 0) return false;
  direct_ = true;
  return true;
}

void File::disable_direct() {
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd_.get(), F_SETFL, flags & ~O_DIRECT);
  direct_ = false;
}

void File::pwrite_all(const void* data, size_t n, uint64_t offset) {
  check_range(path_, n, offset);
  const auto* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd_.get(), bytes + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_) {
        disable_direct();
        continue;
      }
      throw_errno(fmt::format("write of {} bytes at offset {} to", n, offset), path_, errno);
    }
    if (w == 0) throw_errno(fmt::format("write at offset {} to", offset + done), path_, ENOSPC);
    done += static_cast<size_t>(w);
  }
}

void File::pread_all(void* data, size_t n, uint64_t offset) const {
  check_range(path_, n, offset);
  auto* bytes = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_.get(), bytes + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno(fmt::format("read of {} bytes at offset {} from", n, offset), path_, errno);
    }
    if (r == 0) {
      throw CorruptionError(
          fmt::format("unexpected end of file {} at offset {} (wanted {} bytes, file has {}); the file is truncated "
                      "or does not belong to this checkpoint",
                      path_, offset, n, size()),
          path_);
    }
    done += static_cast<size_t>(r);
  }
}

void File::preadv_all(std::vector<struct iovec>& iov, uint64_t offset) const {
  uint64_t n = 0;
  for (const struct iovec& v : iov) n += v.iov_len;
  check_range(path_, n, offset);
  size_t first = 0;
  uint64_t done = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t r = ::preadv(fd_.get(), iov.data() + first, count, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno(fmt::format("read of {} bytes at offset {} from", n - done, offset + done), path_, errno);
    }
    if (r == 0) {
      throw CorruptionError(
          fmt::format("unexpected end of file {} at offset {} (wanted {} bytes, file has {}); the file is truncated "
                      "or does not belong to this checkpoint",
                      path_, offset + done, n - done, size()),
          path_);
    }
    done += static_cast<uint64_t>(r);
    for (auto left = static_cast<size_t>(r); left > 0;) {  // skip what was filled, trim a partly filled buffer
      struct iovec& v = iov[first];
      const size_t take = std::min(left, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + take;
      v.iov_len -= take;
      left -= take;
      if (v.iov_len == 0) ++first;
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
  }
}

uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) throw_errno("stat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::resize(uint64_t size) {
  int rc;
  do {
    rc = ::ftruncate(fd_.get(), static_cast<off_t>(size));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) throw_errno("ftruncate", path_, errno);
}

void File::sync() {
  int rc;
  do {
    rc = ::fsync(fd_.get());
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) throw_errno("fsync", path_, errno);
}

void File::close() {
  if (!fd_.valid()) return;
  const int fd = fd_.release();
  // No retry on EINTR: Linux has released the descriptor either way. An
  // error here can be a deferred write error (NFS), so it must surface.
  if (::close(fd) != 0 && errno != EINTR) throw_errno("close", path_, errno);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  try {
    File file(tmp, File::Mode::kCreateTruncate);
    file.pwrite_all(bytes.data(), bytes.size(), 0);
    file.sync();
    file.close();
    rename_path(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());  // best effort: never leave a half-written temp behind
    throw;
  }
  fsync_dir(parent_dir(path));
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  File file(path, File::Mode::kRead);
  return read_all(file, max_bytes);
}

std::string read_all(const File& file, uint64_t max_bytes) {
  const uint64_t size = file.size();
  if (size > max_bytes) {
    throw CorruptionError(fmt::format("{} is {} bytes, more than the {} bytes such a file may have; it is "
                                      "not the file distckpt wrote",
                                      file.path(), size, max_bytes),
                          file.path());
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  file.pread_all(bytes.data(), bytes.size(), 0);
  return bytes;
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    throw IoError(fmt::format("rename of '{}' to '{}' failed: {}", from, to, std::strerror(err)), from, err);
  }
}

void rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  const int err = errno;
  if (err == EEXIST) {
    throw CheckpointError(
        fmt::format("'{}' appeared while it was being written; it was left as it is and nothing replaced it", to), to);
  }
  if (err != EINVAL && err != ENOSYS) {
    throw IoError(fmt::format("rename of '{}' to '{}' failed: {}", from, to, std::strerror(err)), from, err);
  }
  // The file system cannot refuse for us: check, then rename.
  if (exists(to)) {
    throw CheckpointError(
        fmt::format("'{}' appeared while it was being written; it was left as it is and nothing replaced it", to), to);
  }
  rename_path(from, to);
}

void rename_into_empty(const std::string& from, const std::string& to) {
  // rename(2) of a directory replaces an empty directory, atomically, and
  // nothing else: a file, a link or a directory with entries stays.
  if (::rename(from.c_str(), to.c_str()) == 0) return;
  const int err = errno;
  if (err == ENOTEMPTY || err == EEXIST || err == ENOTDIR || err == EISDIR) {
    throw CheckpointError(
        fmt::format("'{}' appeared or was written into while the export ran; it was left as it is", to), to);
  }
  throw IoError(fmt::format("rename of '{}' to '{}' failed: {}", from, to, std::strerror(err)), from, err);
}

bool holds_nothing(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    throw_errno("lstat", path, errno);
  }
  return S_ISDIR(st.st_mode) && is_empty_dir(path);
}

void fsync_dir(const std::string& dir) {
  const UniqueFd fd = open_retrying(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (!fd.valid()) throw_errno("open directory", dir, errno);
  int rc;
  do {
    rc = ::fsync(fd.get());
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) throw_errno("fsync of directory", dir, errno);
}

void make_dirs(const std::string& dir) {
  if (dir.empty()) throw UsageError("make_dirs: the directory path is empty");
  // Create each prefix in turn; EEXIST is fine as long as it is a directory.
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string prefix = dir.substr(0, pos);
    if (prefix.empty() || prefix == "/") continue;
    if (::mkdir(prefix.c_str(), 0755) == 0) continue;
    const int err = errno;
    if (err == EEXIST && is_dir(prefix)) continue;
    throw_errno("create directory", prefix, err == EEXIST ? ENOTDIR : err);
  }
}

std::vector<std::string> list_dir(const std::string& path) {
  const UniqueFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) throw_errno("open directory", path, errno);
  return names_in(dir.get(), path);
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw_errno("stat", path, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    // A file or a symlink (removed itself, never its target).
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_errno("unlink", path, errno);
    return;
  }
  {
    const UniqueFd fd = open_retrying(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (!fd.valid()) throw_errno("open directory", path, errno);
    remove_children(fd.get(), path);
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) throw_errno("rmdir", path, errno);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool lexists(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw_errno("stat", path, errno);
}

bool exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw_errno("stat", path, errno);
}

bool is_dir(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw_errno("stat", path, errno);
}

bool is_empty_dir(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return true;
    if (errno == ENOTDIR) return false;
    throw_errno("opendir", path, errno);
  }
  bool empty = true;
  errno = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  const int err = errno;
  ::closedir(dir);
  if (empty && err != 0) throw_errno("readdir", path, err);
  return empty;
}

uint64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_errno("stat", path, errno);
  return static_cast<uint64_t>(st.st_size);
}

bool exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  const int err = errno;
  // File systems without the flag (some network and FUSE ones) say so
  // with these; the caller falls back to two renames.
  if (err == EINVAL || err == ENOSYS || err == EOPNOTSUPP) return false;
  throw IoError(fmt::format("exchange of '{}' with '{}' failed: {}", a, b, std::strerror(err)), a, err);
}

}  // namespace distckpt::io
