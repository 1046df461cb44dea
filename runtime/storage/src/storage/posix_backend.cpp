// PosixBackend: io::File under the checkpoint rules of io/safe_path.
#include "storage/posix_backend.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "distckpt/core/errors.h"
#include "io/file.h"

namespace distckpt::storage {
namespace {

class FileReader final : public ObjectReader {
 public:
  explicit FileReader(io::File file) : file_(std::move(file)), size_(file_.size()) {}
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, uint64_t length, uint8_t* out) const override { file_.pread_all(out, length, offset); }
  void readv(const std::vector<struct iovec>& iov, uint64_t offset) const override {
    std::vector<struct iovec> consumed = iov;  // preadv_all consumes its list
    file_.preadv_all(consumed, offset);
  }

 private:
  io::File file_;
  uint64_t size_;
};

// Written under "<name>.tmp", renamed over `name` by finish().
class FileWriter final : public ObjectWriter {
 public:
  FileWriter(std::string path) : path_(std::move(path)), temp_(path_ + ".tmp") {
    file_ = io::File(temp_, io::File::Mode::kCreateTruncate);
  }
  ~FileWriter() override {
    if (!finished_) abort();
  }
  void write(uint64_t offset, const uint8_t* data, uint64_t length) override { file_.pwrite_all(data, length, offset); }
  void finish(uint64_t size) override {
    if (file_.size() != size) file_.resize(size);
    file_.sync();
    file_.close();
    io::rename_path(temp_, path_);
    io::fsync_dir(parent_of(path_));
    finished_ = true;
  }
  void abort() noexcept override {
    finished_ = true;
    ::unlink(temp_.c_str());
  }

 private:
  static std::string parent_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  }

  std::string path_, temp_;
  io::File file_;
  bool finished_ = false;
};

void list_below(const std::string& dir, const std::string& relative, const std::string& prefix, size_t limit,
                bool below, std::vector<StoredObject>& out) {
  for (const std::string& name : io::list_dir(dir)) {
    if (limit != 0 && out.size() >= limit) return;
    const std::string rel = relative.empty() ? name : relative + "/" + name;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // gone meanwhile
    if (S_ISDIR(st.st_mode)) {
      // Only directories that can hold names with the prefix; links to
      // directories are not followed.
      const std::string inside = rel + "/";
      const size_t n = std::min(inside.size(), prefix.size());
      if (below && inside.compare(0, n, prefix, 0, n) == 0) list_below(path, rel, prefix, limit, below, out);
      continue;
    }
    if (rel.compare(0, prefix.size(), prefix) != 0) continue;
    // A link to a file is listed as the file (a hub snapshot's files are links).
    if (S_ISLNK(st.st_mode) && (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))) continue;
    if (S_ISREG(st.st_mode)) out.push_back({rel, static_cast<uint64_t>(st.st_size)});
  }
}

}  // namespace

PosixBackend::PosixBackend(std::string root, Links links) : root_(std::move(root)), links_(links) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  if (root_.empty()) root_ = ".";
}

std::string PosixBackend::path_of(const std::string& name) const {
  return name.empty() ? root_ : io::safe_join(root_, name);
}

bool PosixBackend::root_exists() { return io::is_dir(root_); }

std::vector<StoredObject> PosixBackend::list(const std::string& prefix, size_t limit, bool below) {
  std::vector<StoredObject> out;
  if (!io::is_dir(root_)) return out;
  list_below(root_, "", prefix, limit, below, out);
  std::sort(out.begin(), out.end(), [](const StoredObject& a, const StoredObject& b) { return a.name < b.name; });
  return out;
}

std::optional<uint64_t> PosixBackend::size_of(const std::string& name) {
  const std::string path = path_of(name);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    const int err = errno;
    throw IoError(fmt::format("stat '{}' failed: {}", path, std::strerror(err)), path, err);
  }
  if (links_ == Links::kInside) io::check_inside(root_, path);
  if (!S_ISREG(st.st_mode)) {
    throw CorruptionError(
        fmt::format("'{}' is not a regular file ({}); distckpt reads checkpoints from regular files only", path,
                    S_ISDIR(st.st_mode)    ? "a directory"
                    : S_ISFIFO(st.st_mode) ? "a FIFO"
                                           : "a device or socket"),
        path);
  }
  return static_cast<uint64_t>(st.st_size);
}

std::unique_ptr<ObjectReader> PosixBackend::open(const std::string& name) {
  const std::string path = path_of(name);
  return std::make_unique<FileReader>(links_ == Links::kInside ? io::open_inside(root_, path)
                                                               : io::File(path, io::File::Mode::kRead));
}

std::unique_ptr<ObjectWriter> PosixBackend::create(const std::string& name, uint64_t /*size_hint*/) {
  const std::string path = path_of(name);
  const size_t slash = name.rfind('/');
  if (slash != std::string::npos) io::make_dirs(io::safe_join(root_, name.substr(0, slash)));
  return std::make_unique<FileWriter>(path);
}

bool PosixBackend::publish(const std::string& name, std::string_view bytes, bool if_absent) {
  const std::string path = path_of(name);
  if (!if_absent) {
    io::write_file_atomic(path, bytes);
    return true;
  }
  // link(2) never replaces: of two writers, one links and the other finds it there.
  const std::string temp = fmt::format("{}.{}.tmp", path, ::getpid());
  io::write_file_atomic(temp, bytes);
  const int linked = ::link(temp.c_str(), path.c_str());
  const int err = errno;
  ::unlink(temp.c_str());
  if (linked != 0) {
    if (err == EEXIST) return false;
    throw IoError(fmt::format("link of '{}' to '{}' failed: {}", temp, path, std::strerror(err)), path, err);
  }
  const size_t slash = path.rfind('/');
  io::fsync_dir(slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1)));
  return true;
}

void PosixBackend::remove(const std::string& name) {
  const std::string path = path_of(name);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    throw IoError(fmt::format("unlink '{}' failed: {}", path, std::strerror(err)), path, err);
  }
}

}  // namespace distckpt::storage
