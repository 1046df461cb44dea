#include "storage/s3/retry.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

namespace distckpt::s3 {

std::chrono::milliseconds backoff_ceiling(const RetryPolicy& policy, int failures) {
  const int doublings = std::clamp(failures - 1, 0, 30);
  const int64_t base = std::max<int64_t>(policy.base_delay.count(), 0);
  const int64_t grown = base > (INT64_MAX >> doublings) ? INT64_MAX : base << doublings;
  return std::chrono::milliseconds(std::min<int64_t>(grown, policy.max_delay.count()));
}

std::chrono::milliseconds full_jitter(std::chrono::milliseconds ceiling, uint64_t random) {
  if (ceiling.count() <= 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(static_cast<int64_t>(random % (static_cast<uint64_t>(ceiling.count()) + 1)));
}

RetryBudget::RetryBudget(const RetryPolicy& policy) : policy_(policy), start_(std::chrono::steady_clock::now()) {}

bool RetryBudget::wait_for_next() {
  if (attempts_ >= policy_.max_attempts) return false;
  // Threads draw their own jitter, so that clients failing together do not retry together.
  thread_local std::mt19937_64 random(std::random_device{}());
  const auto delay = full_jitter(backoff_ceiling(policy_, attempts_), random());
  const auto elapsed = std::chrono::steady_clock::now() - start_;
  if (elapsed + delay > policy_.max_elapsed) return false;
  std::this_thread::sleep_for(delay);
  ++attempts_;
  return true;
}

std::string RetryBudget::summary() const {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char text[64];
  std::snprintf(text, sizeof(text), "%d attempt%s over %.1f s", attempts_, attempts_ == 1 ? "" : "s", seconds);
  return text;
}

}  // namespace distckpt::s3
