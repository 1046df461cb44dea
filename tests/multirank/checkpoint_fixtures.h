// Shared helpers for multi-rank checkpoint tests: deterministic global
// tensors, and a test-local log capture.
#pragma once

#include <ATen/ATen.h>

#include <mutex>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "io/file.h"

namespace distckpt::testing {

// A global tensor whose values depend on its key and position, so any shard
// of any layout can be checked against it.
inline at::Tensor global_tensor(const std::string& key, const Shape& shape, at::ScalarType dtype = at::kFloat) {
  const double salt = static_cast<double>(std::hash<std::string>{}(key) % 1009);
  return at::arange(numel(shape), at::kDouble).reshape(shape).add(salt * 1000).to(dtype);
}

// Collects warnings for the lifetime of the object (all ranks' threads).
class LogCapture {
 public:
  LogCapture() {
    previous_ = set_log_sink([this](LogLevel, const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(m);
    });
  }
  ~LogCapture() { set_log_sink(previous_); }
  std::string joined() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string all;
    for (const auto& l : lines_) all += l + "\n";
    return all;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
  LogSink previous_;
};

}  // namespace distckpt::testing
