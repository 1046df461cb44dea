// Reading the rank and rendezvous address from the environment, as
// distckpt-launch and torchrun set them.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "distckpt/comm/process_group.h"
#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

constexpr const char* kHowToLaunch =
    "run under distckpt-launch or torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
    "yourself";

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// The whole text must be a decimal integer within [min, max].
int parse_int(const char* name, const std::string& text, int min, int max) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end || value < min || value > max) {
    throw UsageError(fmt::format("environment variable {}='{}' is not an integer in [{}, {}]; {}", name, text, min, max,
                                 kHowToLaunch));
  }
  return value;
}

// Seconds, integer or decimal, above zero and at most a week (a larger value
// is almost certainly a unit mistake, e.g. milliseconds).
std::chrono::milliseconds parse_timeout(const char* name, const std::string& text) {
  constexpr double kMaxSeconds = 7 * 24 * 3600;
  double seconds = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, seconds, std::chars_format::fixed);
  if (error != std::errc() || stop != end || !std::isfinite(seconds) || seconds <= 0 || seconds > kMaxSeconds) {
    throw UsageError(fmt::format(
        "environment variable {}='{}' is not a timeout in seconds; give a number above 0 and at most {} (e.g. 30 "
        "or 2.5)",
        name, text, kMaxSeconds));
  }
  // At least 1 ms: a positive value must never become "no time at all".
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000))));
}

}  // namespace

LaunchEnv read_launch_env() {
  // Name every missing variable at once: fixing them one run at a time is slow.
  std::vector<std::string> missing;
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    if (!env_value(name)) missing.emplace_back(name);
  }
  if (!missing.empty()) {
    throw UsageError(fmt::format("environment variable{} {} {} not set; {}", missing.size() > 1 ? "s" : "",
                                 fmt::join(missing, ", "), missing.size() > 1 ? "are" : "is", kHowToLaunch));
  }

  LaunchEnv env;
  env.world_size = parse_int("WORLD_SIZE", *env_value("WORLD_SIZE"), 1, INT_MAX);
  env.rank = parse_int("RANK", *env_value("RANK"), 0, INT_MAX);
  if (env.rank >= env.world_size) {
    throw UsageError(fmt::format("environment variable RANK={} must be below WORLD_SIZE={}; {}", env.rank,
                                 env.world_size, kHowToLaunch));
  }
  if (auto local_rank = env_value("LOCAL_RANK")) {
    env.local_rank = parse_int("LOCAL_RANK", *local_rank, 0, INT_MAX);
  }
  env.master_addr = *env_value("MASTER_ADDR");
  env.master_port = parse_int("MASTER_PORT", *env_value("MASTER_PORT"), 1, 65535);
  env.timeout = timeout_from_env();
  return env;
}

std::optional<std::chrono::milliseconds> timeout_from_env() {
  if (auto timeout = env_value(kTimeoutVariable)) return parse_timeout(kTimeoutVariable, *timeout);
  return std::nullopt;
}

}  // namespace distckpt
