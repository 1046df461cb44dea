// Starting threads in a process that may be at its thread limit (ulimit -u,
// a container's pids.max): std::thread's constructor then throws
// std::system_error, which alone says only "Resource temporarily
// unavailable", and a vector that already holds running threads must not be
// destroyed unjoined.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace distckpt::io {

// What to tell the user when a thread for `what` (e.g. "writing FILE")
// could not start.
std::string thread_start_failure(const std::string& what, const std::system_error& e);

// One thread running `body`; Error (thread_start_failure) when it cannot start.
std::thread start_thread(std::function<void()> body, const std::string& what);

// Appends up to `n` threads running `body` to `threads`, stopping at the
// first that cannot start: the work runs on those that did. Throws Error
// (thread_start_failure) only when `n` > 0 and none started.
void start_threads(std::vector<std::thread>& threads, size_t n, const std::function<void()>& body,
                   const std::string& what);

}  // namespace distckpt::io
