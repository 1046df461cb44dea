// Shared-memory regions: what a creator writes, an opener sees read-only;
// names are checked; names left by killed processes are removed once old.
#include "io/shared_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "distckpt/core/errors.h"

namespace distckpt::io {
namespace {

TEST(SharedMemory, AnOpenerSeesTheCreatorsBytesAndCounters) {
  SharedRegion region = SharedRegion::create(8192);
  std::memcpy(region.data() + 100, "slab", 4);
  raise_counter(region.data(), 3);
  const SharedRegion view = SharedRegion::open_read_only(region.name(), 8192);
  EXPECT_EQ(std::memcmp(view.data() + 100, "slab", 4), 0);
  EXPECT_EQ(read_counter(view.data()), 3u);
  EXPECT_EQ(wait_counter_change(view.data(), 2, std::chrono::milliseconds(1)), 3u);  // already changed: no wait
  EXPECT_THROW(SharedRegion::open_read_only(region.name(), 8193), Error);            // smaller than expected
  region.unlink();
  EXPECT_THROW(SharedRegion::open_read_only(region.name(), 8192), Error);
  for (const char* bad : {"/etc/passwd", "/distckpt-", "/distckpt-12-", "/distckpt-x1-ab", "/distckpt-1-AB", "../x"}) {
    EXPECT_FALSE(SharedRegion::is_region_name(bad)) << bad;
    EXPECT_THROW(SharedRegion::open_read_only(bad, 1), Error) << bad;
  }
}

// A region name whose process is `pid`, written `age_seconds` ago.
std::string plant(pid_t pid, const std::string& tag, time_t age_seconds) {
  const std::string path = "/dev/shm/distckpt-" + std::to_string(pid) + "-" + tag;
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  EXPECT_GE(fd, 0) << path;
  const struct timespec times[2] = {{::time(nullptr) - age_seconds, 0}, {::time(nullptr) - age_seconds, 0}};
  ::futimens(fd, times);
  ::close(fd);
  return path;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

TEST(SharedMemory, NamesOfGoneProcessesAreRemovedOnceOld) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // its pid names no process now
  const std::string old_gone = plant(child, "00000000000000a1", 3600);
  const std::string new_gone = plant(child, "00000000000000a2", 5);
  const std::string old_alive = plant(::getpid(), "00000000000000a3", 3600);
  const SharedRegion region = SharedRegion::create(4096);
  EXPECT_FALSE(exists(old_gone));
  EXPECT_TRUE(exists(new_gone));   // its setup may still be running elsewhere
  EXPECT_TRUE(exists(old_alive));  // its process lives
  ::unlink(new_gone.c_str());
  ::unlink(old_alive.c_str());
}

}  // namespace
}  // namespace distckpt::io
