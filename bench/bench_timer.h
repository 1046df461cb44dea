// Timing for the benchmarks: every sample is taken on each rank between two
// barriers, so it is the time of the slowest rank; the median is reported.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "disk_stats.h"
#include "distckpt/comm/communicator.h"

namespace bench {

// NaN when there is nothing to take the median of (a figure the run skipped).
inline double median_of(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Timer {
 public:
  explicit Timer(distckpt::Communicator& comm) : comm_(comm) {}
  // `disk`, when given, records what the device did in the same interval.
  template <typename F>
  void run(F&& f, DiskWatch* disk = nullptr) {
    comm_.barrier();
    if (disk != nullptr) disk->start();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    comm_.barrier();
    samples_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (disk != nullptr) disk->stop(samples_.back());
  }
  double median() const { return median_of(samples_); }
  const std::vector<double>& samples() const { return samples_; }

 protected:
  distckpt::Communicator& comm_;
  std::vector<double> samples_;
};

// For what keeps one rank's caller (a trainer in an asynchronous save): each
// rank times its own calls with no barrier after them (a barrier would also
// wait for work the call left running on other ranks); record() then keeps
// the slowest rank's time, gathered outside the timed region.
class RankTimer : public Timer {
 public:
  using Timer::Timer;
  template <typename F>
  double time(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Collective.
  void record(double seconds) {
    double slowest = seconds;
    for (const std::string& bytes :
         comm_.all_gather_bytes(std::string(reinterpret_cast<const char*>(&seconds), sizeof seconds))) {
      double other = 0;
      std::memcpy(&other, bytes.data(), std::min(bytes.size(), sizeof other));
      slowest = std::max(slowest, other);
    }
    samples_.push_back(slowest);
  }
};

}  // namespace bench
