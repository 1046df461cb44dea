// Paths read from checkpoint metadata are untrusted: a crafted or corrupted
// metadata.fb must not make a load read (or a cleanup delete) anything
// outside the checkpoint directory. Only '/' separates components.
#include <fmt/format.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
#include "io/file.h"

namespace distckpt::io {
namespace {

constexpr size_t kMaxPathLength = 4096;  // PATH_MAX on Linux
constexpr size_t kMaxQuotedLength = 200;

// The path as it can be printed: control bytes escaped, long paths shortened
// (the full length is given so nothing is hidden).
std::string printable(std::string_view path) {
  std::string out;
  for (const char c : path.substr(0, kMaxQuotedLength)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  if (path.size() > kMaxQuotedLength) out += fmt::format("... ({} bytes)", path.size());
  return out;
}

[[noreturn]] void reject(std::string_view path, std::string_view reason) {
  throw CorruptionError(fmt::format("unsafe path '{}' in checkpoint metadata: {}", printable(path), reason));
}

std::string real_path(const std::string& path) {
  char buffer[PATH_MAX];
  if (::realpath(path.c_str(), buffer) == nullptr) {
    const int err = errno;
    throw IoError(fmt::format("cannot resolve '{}': {}", path, std::strerror(err)), path, err);
  }
  return buffer;
}

bool under(const std::string& path, std::string folder) {
  if (folder.back() != '/') folder += '/';
  return path.compare(0, folder.size(), folder) == 0;
}

// The Hugging Face hub cache folder whose `blobs` the files of `root` may
// link into: <repo> when `root` is <repo>/snapshots/<revision>, or a folder
// below one (a model's `text_encoder/`); empty otherwise.
std::string hub_repository(const std::string& root) {
  for (size_t at = root.find("/snapshots/"); at != std::string::npos; at = root.find("/snapshots/", at + 1)) {
    const size_t revision = at + std::string_view("/snapshots/").size();
    if (revision < root.size() && root[revision] != '/' && at > 0) return root.substr(0, at);
  }
  return "";
}

// Throws unless `target`, what `path` resolves to, lies inside `dir` (or the
// blobs of the hub repository `dir` is a snapshot of: that folder belongs to
// the checkpoint too).
void check_target(const std::string& dir, const std::string& path, const std::string& target) {
  // Every open of a checkpoint's files resolves the same folder: the last
  // one resolved is kept per thread (a folder moved meanwhile can only make
  // the check refuse, never accept, a file outside both).
  thread_local std::string last_dir, last_root;
  if (dir != last_dir) {
    last_root = real_path(dir);
    last_dir = dir;
  }
  const std::string& root = last_root;
  if (under(target, root)) return;
  const std::string repository = hub_repository(root);
  if (!repository.empty() && under(target, repository + "/blobs")) return;
  throw CorruptionError(
      fmt::format("{} resolves to {}, outside the checkpoint {}; distckpt does not follow links out of a "
                  "checkpoint: copy the files into it (cp -L)",
                  path, target, dir),
      path);
}

}  // namespace

void check_inside(const std::string& dir, const std::string& path) {
  // The usual case costs one lstat per component below `dir` (data/x.bin:
  // two), not a resolution of the whole path: only a link on the way is
  // resolved and compared. (`dir` itself may be reached through links.)
  size_t start = path.compare(0, dir.size(), dir) == 0 ? dir.size() : 0;
  bool linked = start == 0;  // not under `dir` as written: resolve
  while (!linked && start < path.size()) {
    while (start < path.size() && path[start] == '/') ++start;
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string::npos ? path.size() : slash;
    if (end == start) break;
    struct stat st {};
    linked = ::lstat(path.substr(0, end).c_str(), &st) != 0 || S_ISLNK(st.st_mode);
    start = end;
  }
  if (linked) check_target(dir, path, real_path(path));
}

File open_inside(const std::string& dir, const std::string& path) {
  File file(path, File::Mode::kRead);
  // What the descriptor reached, whatever happened to the names since.
  char target[PATH_MAX];
  const std::string link = fmt::format("/proc/self/fd/{}", file.fd());
  const ssize_t n = ::readlink(link.c_str(), target, sizeof target);
  if (n <= 0 || static_cast<size_t>(n) == sizeof target) {
    check_inside(dir, path);  // no /proc: the check by name
  } else {
    check_target(dir, path, std::string(target, static_cast<size_t>(n)));
  }
  return file;
}

std::string read_file_inside(const std::string& dir, const std::string& path, uint64_t max_bytes) {
  File file = open_inside(dir, path);
  return read_all(file, max_bytes);
}

void validate_relative_path(std::string_view relative) {
  if (relative.empty()) reject(relative, "the path is empty");
  if (relative.size() > kMaxPathLength) {
    reject(relative, fmt::format("longer than {} bytes", kMaxPathLength));
  }
  if (relative.find('\0') != std::string_view::npos) reject(relative, "it contains a NUL byte");
  if (relative.front() == '/') reject(relative, "absolute paths are not allowed");
  size_t start = 0;
  while (true) {
    const size_t slash = relative.find('/', start);
    const std::string_view component =
        relative.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (component.empty()) reject(relative, "it has an empty component");
    if (component == "." || component == "..") {
      reject(relative, fmt::format("'{}' components are not allowed", component));
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
}

std::string safe_join(const std::string& dir, std::string_view relative) {
  validate_relative_path(relative);
  if (dir.empty()) return std::string(relative);
  std::string joined = dir;
  if (joined.back() != '/') joined += '/';
  joined += relative;
  return joined;
}

}  // namespace distckpt::io
