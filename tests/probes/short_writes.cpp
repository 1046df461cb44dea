// LD_PRELOAD library for the short-write tests: pwrite/pwrite64/write on a
// file whose path contains $DISTCKPT_SHORT_WRITE_MATCH move at most
// $DISTCKPT_SHORT_WRITE_BYTES bytes, done by the kernel, so the data that
// lands is exactly what the returned count says (a faked return value, as
// strace's retval= gives, would leave holes). The number of writes cut short
// is printed to stderr at exit, so a test can tell the fault happened.
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

std::atomic<long> cut_short{0};

// The cap for this descriptor, 0 when its writes pass unchanged.
size_t cap_for(int fd) {
  const char* match = std::getenv("DISTCKPT_SHORT_WRITE_MATCH");
  const char* bytes = std::getenv("DISTCKPT_SHORT_WRITE_BYTES");
  if (match == nullptr || bytes == nullptr) return 0;
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char path[4096];
  const ssize_t n = ::readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return std::strstr(path, match) != nullptr ? std::strtoul(bytes, nullptr, 10) : 0;
}

size_t capped(int fd, size_t count) {
  const size_t cap = cap_for(fd);
  if (cap == 0 || count <= cap) return count;
  cut_short.fetch_add(1);
  return cap;
}

struct Report {
  ~Report() {
    if (std::getenv("DISTCKPT_SHORT_WRITE_MATCH") != nullptr) {
      std::fprintf(stderr, "short_writes: %ld writes cut short\n", cut_short.load());
    }
  }
} report;

}  // namespace

extern "C" {

ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) {
  return syscall(SYS_pwrite64, fd, buf, capped(fd, count), offset);
}

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  return syscall(SYS_pwrite64, fd, buf, capped(fd, count), offset);
}

ssize_t write(int fd, const void* buf, size_t count) { return syscall(SYS_write, fd, buf, capped(fd, count)); }

}  // extern "C"
