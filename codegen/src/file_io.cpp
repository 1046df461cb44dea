// Reading and writing distckpt-gen's files (see file_io.h).
#include "file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace distckpt::gen {
namespace {

namespace fs = std::filesystem;

std::string os_error(const char* what, const fs::path& path, int error) {
  return fmt::format("cannot {} {}: {}", what, path.string(), std::strerror(error));
}

// A complete temporary file, to be renamed over its target.
struct Staged {
  fs::path target;
  fs::path temp;
};

void remove_all(const std::vector<Staged>& staged) {
  for (const Staged& s : staged) ::unlink(s.temp.c_str());
}

// Writes `content` to a new temporary file in the directory of `target`:
// rename() replaces a file atomically only within one file system.
std::string stage(const fs::path& target, const std::string& content, std::vector<Staged>& staged) {
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  int fd = -1;
  fs::path temp;
  for (int attempt = 0; fd < 0; ++attempt) {
    temp = dir / fmt::format(".{}.{}-{}.tmp", target.filename().string(), ::getpid(), attempt);
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 100)) return os_error("create a temporary file in", dir, errno);
  }
  staged.push_back(Staged{target, temp});
  for (size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return os_error("write", temp, error);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return os_error("write", temp, errno);
  return "";
}

bool holds(const fs::path& path, const std::string& content) {
  std::string ignored;
  const std::optional<std::string> old = read_file(path, ignored);
  return old && *old == content;
}

}  // namespace

std::optional<std::string> read_file(const fs::path& path, std::string& error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    error = os_error("read", path, errno);
    return std::nullopt;
  }
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = os_error("read", path, errno);
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string make_output_dir(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return fmt::format("cannot create the output directory {}: {}", dir.string(), error.message());
  return "";
}

std::string write_files(const std::vector<std::pair<fs::path, std::string>>& files) {
  std::vector<Staged> staged;
  for (const auto& [path, content] : files) {
    if (holds(path, content)) continue;
    const std::string error = stage(path, content, staged);
    if (!error.empty()) {
      remove_all(staged);
      return error;
    }
  }
  for (size_t i = 0; i < staged.size(); ++i) {
    if (::rename(staged[i].temp.c_str(), staged[i].target.c_str()) != 0) {
      const std::string error = os_error("replace", staged[i].target, errno);
      remove_all({staged.begin() + static_cast<std::ptrdiff_t>(i), staged.end()});
      return error;
    }
  }
  return "";
}

}  // namespace distckpt::gen
