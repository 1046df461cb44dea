#include "distckpt/core/log.h"

#include <iostream>
#include <mutex>

namespace distckpt {
namespace {

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}
LogSink& current_sink() {
  static LogSink sink;
  return sink;
}

}  // namespace

LogSink set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  LogSink previous = std::move(current_sink());
  current_sink() = std::move(sink);
  return previous;
}

void log_message(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (current_sink()) {
    current_sink()(level, message);
    return;
  }
  std::cerr << (level == LogLevel::kWarning ? "distckpt WARNING: " : "distckpt: ") << message << '\n';
}

}  // namespace distckpt
