// Where distckpt's warnings go (strict-handling "log" modes, recoveries).
// Default: stderr. Tests and trainers can install their own sink.
#pragma once

#include <functional>
#include <string>

namespace distckpt {

enum class LogLevel { kInfo, kWarning };
using LogSink = std::function<void(LogLevel, const std::string&)>;

// Installs `sink` (nullptr restores stderr); returns the previous one.
LogSink set_log_sink(LogSink sink);
void log_message(LogLevel level, const std::string& message);

}  // namespace distckpt
