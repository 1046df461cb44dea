#include "io/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <utility>

#include "distckpt/core/errors.h"
#include "io/unique_fd.h"

namespace distckpt::io {
namespace {

constexpr const char* kPrefix = "/distckpt-";

std::string errno_text(int error) { return std::strerror(error); }

uint8_t* map(int fd, uint64_t bytes, int protection, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, protection, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int error = errno;
    throw IoError(fmt::format("cannot map shared memory {}: {}", name, errno_text(error)), name, error);
  }
  return static_cast<uint8_t*>(p);
}

// Regions left by processes killed before they unlinked them: a name of ours
// whose process is gone from this pid namespace, untouched for ten minutes
// (a live region's creator unlinks it within its load's setup), owned by
// this user. Best effort.
void remove_abandoned_regions() {
  constexpr time_t kAge = 600;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = std::string("/") + e->d_name;
    if (!SharedRegion::is_region_name(name)) continue;
    const long pid = std::strtol(name.c_str() + std::strlen(kPrefix), nullptr, 10);
    struct stat st {};
    if (pid <= 0 || ::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || now - st.st_mtime < kAge) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::shm_unlink(name.c_str());
  }
  ::closedir(dir);
}

}  // namespace

SharedRegion::~SharedRegion() { reset(); }

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owner_(std::exchange(other.owner_, false)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    reset();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

void SharedRegion::reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  unlink();
  data_ = nullptr;
  size_ = 0;
}

void SharedRegion::unlink() {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

bool SharedRegion::is_region_name(const std::string& name) {
  const size_t prefix = std::strlen(kPrefix);
  if (name.size() <= prefix || name.size() > 64 || name.compare(0, prefix, kPrefix) != 0) return false;
  const size_t dash = name.find('-', prefix);
  if (dash == std::string::npos || dash == prefix || dash + 1 == name.size()) return false;
  for (size_t i = prefix; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = i < dash ? (c >= '0' && c <= '9') : (i == dash || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    if (!ok) return false;
  }
  return true;
}

SharedRegion SharedRegion::create(uint64_t bytes) {
  if (bytes == 0) throw UsageError("a shared memory region needs at least one byte");
  remove_abandoned_regions();
  std::random_device random;
  const uint64_t tag = (uint64_t{random()} << 32) ^ random();
  SharedRegion region;
  region.name_ = fmt::format("{}{}-{:016x}", kPrefix, ::getpid(), tag);
  UniqueFd fd(::shm_open(region.name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int error = errno;
    throw IoError(fmt::format("cannot create shared memory {} ({}): ranks on one host share the bytes they read "
                              "through /dev/shm; mount it, or load with LoadExchange::kNone",
                              region.name_, errno_text(error)),
                  region.name_, error);
  }
  region.owner_ = true;
  // posix_fallocate reserves the pages now: a full /dev/shm fails here, not
  // with SIGBUS at the first write.
  if (const int error = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); error != 0) {
    throw IoError(fmt::format("cannot reserve {} bytes of shared memory in /dev/shm ({}): free space there, lower "
                              "LoadOptions::exchange_batch_bytes, or load with LoadExchange::kNone",
                              bytes, errno_text(error)),
                  region.name_, error);
  }
  region.data_ = map(fd.get(), bytes, PROT_READ | PROT_WRITE, region.name_);
  region.size_ = bytes;
  return region;
}

SharedRegion SharedRegion::open_read_only(const std::string& name, uint64_t bytes) {
  // The name and the size come from a peer rank's offer: a mismatch is its message's fault.
  if (!is_region_name(name)) throw ProtocolError(fmt::format("'{}' is not a distckpt shared memory name", name));
  UniqueFd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0));
  if (!fd.valid()) {
    const int error = errno;
    throw IoError(fmt::format("cannot open shared memory {}: {}", name, errno_text(error)), name, error);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int error = errno;
    throw IoError(fmt::format("cannot stat shared memory {}: {}", name, errno_text(error)), name, error);
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || static_cast<uint64_t>(st.st_size) < bytes) {
    throw ProtocolError(
        fmt::format("shared memory {} is not the region expected ({} bytes, owned by this user)", name, bytes), name);
  }
  SharedRegion region;
  region.name_ = name;
  if (bytes > 0) region.data_ = map(fd.get(), bytes, PROT_READ, name);
  region.size_ = bytes;
  return region;
}

uint32_t read_counter(const uint8_t* at) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(at), __ATOMIC_ACQUIRE);
}

void raise_counter(uint8_t* at, uint32_t value) {
  auto* word = reinterpret_cast<uint32_t*>(at);
  __atomic_store_n(word, value, __ATOMIC_RELEASE);
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);  // shared (not private): other processes
}

uint32_t wait_counter_change(const uint8_t* at, uint32_t seen, std::chrono::milliseconds slice) {
  const auto* word = reinterpret_cast<const uint32_t*>(at);
  struct timespec wait {};
  wait.tv_sec = static_cast<time_t>(slice.count() / 1000);
  wait.tv_nsec = static_cast<long>(slice.count() % 1000) * 1000000L;
  // Returns at once if the word already changed (EAGAIN), on a wake, or after `slice`.
  if (::syscall(SYS_futex, word, FUTEX_WAIT, seen, &wait, nullptr, 0) != 0 && errno != EAGAIN && errno != ETIMEDOUT &&
      errno != EINTR) {
    ::nanosleep(&wait, nullptr);  // no futex here: poll once per slice rather than spin
  }
  return read_counter(at);
}

}  // namespace distckpt::io
