// How long to wait before the next attempt of a failed S3 request, and
// whether one more fits the budget: exponential backoff with full jitter
// (a uniform wait in [0, min(max_delay, base_delay * 2^(n-1))) after the
// n-th failure), within RetryPolicy's attempts and elapsed time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "storage/s3/config.h"

namespace distckpt::s3 {

// The ceiling of the wait after the `failures`-th failed attempt (1-based).
std::chrono::milliseconds backoff_ceiling(const RetryPolicy& policy, int failures);
// A uniform draw in [0, ceiling] from `random` (any 64-bit value).
std::chrono::milliseconds full_jitter(std::chrono::milliseconds ceiling, uint64_t random);

class RetryBudget {
 public:
  explicit RetryBudget(const RetryPolicy& policy);

  int attempts() const { return attempts_; }
  // After a failed attempt: waits the jittered backoff and returns true when
  // another attempt fits the budget; returns false at once when it does not.
  bool wait_for_next();
  // "8 attempts over 2.3 s", for the final error.
  std::string summary() const;

 private:
  RetryPolicy policy_;
  std::chrono::steady_clock::time_point start_;
  int attempts_ = 1;  // the first one is under way when the budget is made
};

}  // namespace distckpt::s3
