#include "distckpt/core/io_threads.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "distckpt/core/errors.h"

namespace distckpt {

int resolve_io_threads(int requested) {
  if (requested < 0) {
    throw UsageError(
        fmt::format("io_threads is {}: use 0 (one share of this host's cores) or a positive count", requested));
  }
  if (requested > 0) return requested;
  int local_ranks = 1;
  if (const char* env = std::getenv("LOCAL_WORLD_SIZE")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0 && v < (1L << 20)) local_ranks = static_cast<int>(v);
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::clamp(cores / local_ranks, 1, kMaxAutoIoThreads);
}

}  // namespace distckpt
