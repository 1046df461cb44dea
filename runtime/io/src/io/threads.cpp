#include "io/threads.h"

#include <fmt/format.h>

#include <utility>

#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"

namespace distckpt::io {

std::string thread_start_failure(const std::string& what, const std::system_error& e) {
  if (e.code() != std::errc::resource_unavailable_try_again) {
    return fmt::format("could not start a thread for {} ({})", what, e.what());
  }
  return fmt::format(
      "could not start a thread for {} ({}): the process is at its thread limit or out of memory for thread "
      "stacks; raise the limit (ulimit -u, or the container's pids.max) or run fewer threads",
      what, e.what());
}

std::thread start_thread(std::function<void()> body, const std::string& what) {
  try {
    return std::thread(std::move(body));
  } catch (const std::system_error& e) {
    throw Error(thread_start_failure(what, e));
  }
}

void start_threads(std::vector<std::thread>& threads, size_t n, const std::function<void()>& body,
                   const std::string& what) {
  const size_t before = threads.size();
  for (size_t i = 0; i < n; ++i) {
    try {
      threads.emplace_back(body);
    } catch (const std::system_error& e) {
      if (threads.size() == before) throw Error(thread_start_failure(what, e));
      log_message(LogLevel::kWarning,
                  fmt::format("{}; going on with {} of {}", thread_start_failure(what, e), threads.size() - before, n));
      return;
    }
  }
}

}  // namespace distckpt::io
