// Running real processes from tests (launcher, demo, CLI).
#pragma once

#include <string>

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh and collects its output.
CommandResult run_command(const std::string& command);
