// The benchmarks' file helpers: page cache control (every timed read starts
// from the disk, see docs/PERFORMANCE.md) and fsync by path.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/file.h"

namespace bench {

using namespace distckpt;

// Drops the (clean) page-cache pages of a file, or of every file under a
// directory, so the next read comes from the disk.
inline void evict(const std::string& path) {
  auto drop = [](const std::filesystem::path& p) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (!std::filesystem::exists(path)) return;
  if (!std::filesystem::is_directory(path)) return drop(path);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    if (entry.is_regular_file()) drop(entry.path());
  }
}

// Reads a file, or every file under a directory, once (untimed). The virtual
// disk's host caches what was read before, so the first read of freshly
// written data is several times slower than any later one: every timed read
// starts from data read once, then evicted from this machine's page cache.
inline void prime(const std::string& path) {
  if (!std::filesystem::exists(path)) return;
  std::vector<uint8_t> buffer(uint64_t{16} << 20);
  auto read_all = [&](const std::filesystem::path& p) {
    io::File f(p.string(), io::File::Mode::kRead);
    const uint64_t n = f.size();
    for (uint64_t off = 0; off < n; off += buffer.size()) {
      f.pread_all(buffer.data(), std::min<uint64_t>(buffer.size(), n - off), off);
    }
  };
  if (!std::filesystem::is_directory(path)) return read_all(path);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    if (entry.is_regular_file()) read_all(entry.path());
  }
}

// Empties this machine's page cache: all of it through /proc/sys/vm/drop_caches
// when allowed (root), else the files under `path` one by one (fadvise, which
// can leave pages other CPUs hold in their LRU batches).
inline void drop_page_cache(const std::string& path) {
  ::sync();
  {
    std::ofstream drop("/proc/sys/vm/drop_caches");
    if (drop && (drop << "1").flush()) return;
  }
  evict(path);
}

inline void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace bench
