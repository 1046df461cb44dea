// Timing for the benchmarks: every sample is taken on each rank between two
// barriers, so it is the time of the slowest rank; the median is reported.
#pragma once

#include <algorithm>
#include <chrono>
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
  double median() {
    std::sort(samples_.begin(), samples_.end());
    return samples_[samples_.size() / 2];
  }

 private:
  distckpt::Communicator& comm_;
  std::vector<double> samples_;
};

}  // namespace bench
