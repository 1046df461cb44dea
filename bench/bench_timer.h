// Timing for the benchmarks: every sample is taken on each rank between two
// barriers, so it is the time of the slowest rank; the median is reported.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "distckpt/comm/communicator.h"

namespace bench {

class Timer {
 public:
  explicit Timer(distckpt::Communicator& comm) : comm_(comm) {}
  template <typename F>
  void run(F&& f) {
    comm_.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    comm_.barrier();
    samples_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // NaN when nothing was timed (a figure the run skipped).
  double median() const {
    if (samples_.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::vector<double> sorted = samples_;
    std::sort(sorted.begin(), sorted.end());
    return sorted[sorted.size() / 2];
  }
  const std::vector<double>& samples() const { return samples_; }

 private:
  distckpt::Communicator& comm_;
  std::vector<double> samples_;
};

}  // namespace bench
