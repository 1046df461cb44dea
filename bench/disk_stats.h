// What the block device under a directory did during a timed step, from the
// kernel's /proc/diskstats: bytes it read and how long it had I/O in flight
// ("io_ticks"). A step whose device was busy for its whole time is bound by
// the disk; one whose device idled was waiting on something else. The
// counters are the host's, so with several ranks on one host any rank's
// reading covers them all.
#pragma once

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace bench {

struct DiskCounters {
  uint64_t read_bytes = 0;
  uint64_t busy_ms = 0;
};

class DiskWatch {
 public:
  // Watches the device holding `dir`; does nothing where /proc/diskstats
  // does not list it (a network or overlay file system).
  explicit DiskWatch(const std::string& dir) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) {
      major_ = major(st.st_dev);
      minor_ = minor(st.st_dev);
      valid_ = read().has_value();
    }
  }
  bool valid() const { return valid_; }

  void start() { before_ = read().value_or(DiskCounters{}); }
  // Records the step since start(): its device read bytes and busy fraction of `seconds`.
  void stop(double seconds) {
    if (!valid_) return;
    const DiskCounters after = read().value_or(before_);
    read_gb_.push_back(static_cast<double>(after.read_bytes - before_.read_bytes) / 1e9);
    busy_.push_back(seconds > 0 ? static_cast<double>(after.busy_ms - before_.busy_ms) / 1e3 / seconds : 0);
  }
  const std::vector<double>& read_gb() const { return read_gb_; }  // per step
  const std::vector<double>& busy() const { return busy_; }        // per step, a fraction of its time

 private:
  std::optional<DiskCounters> read() const {
    std::ifstream in("/proc/diskstats");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      unsigned maj = 0, min = 0;
      std::string name;
      uint64_t v[10] = {};
      if (!(fields >> maj >> min >> name)) continue;
      for (uint64_t& x : v) fields >> x;
      // reads, merged, sectors read, ms reading, writes, merged, sectors written, ms writing, in flight, io_ticks
      if (fields && maj == major_ && min == minor_) return DiskCounters{v[2] * 512, v[9]};
    }
    return std::nullopt;
  }
  unsigned major_ = 0, minor_ = 0;
  bool valid_ = false;
  DiskCounters before_;
  std::vector<double> read_gb_, busy_;
};

}  // namespace bench
