#include "distckpt/api/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

constexpr std::array<std::pair<StrictHandling, const char*>, 8> kStrictNames{{
    {StrictHandling::kAssumeOkUnexpected, "assume_ok_unexpected"},
    {StrictHandling::kLogUnexpected, "log_unexpected"},
    {StrictHandling::kLogAll, "log_all"},
    {StrictHandling::kRaiseUnexpected, "raise_unexpected"},
    {StrictHandling::kRaiseAll, "raise_all"},
    {StrictHandling::kReturnUnexpected, "return_unexpected"},
    {StrictHandling::kReturnAll, "return_all"},
    {StrictHandling::kIgnoreAll, "ignore_all"},
}};
constexpr std::array<std::pair<WriterPolicy, const char*>, 3> kWriterNames{{
    {WriterPolicy::kBalanced, "balanced"},
    {WriterPolicy::kLowestRank, "lowest_rank"},
    {WriterPolicy::kMainReplica, "main_replica"},
}};
constexpr std::array<std::pair<LoadExchange, const char*>, 4> kExchangeNames{{
    {LoadExchange::kAuto, "auto"},
    {LoadExchange::kNone, "none"},
    {LoadExchange::kBroadcast, "broadcast"},
    {LoadExchange::kAllGather, "all_gather"},
}};

template <typename Enum, size_t N>
Enum parse_name(const std::array<std::pair<Enum, const char*>, N>& names, const std::string& name, const char* what) {
  std::string all;
  for (const auto& [value, spelling] : names) {
    if (name == spelling) return value;
    all += std::string(all.empty() ? "" : ", ") + spelling;
  }
  throw UsageError(fmt::format("unknown {} '{}'; use one of: {}", what, name, all));
}

template <typename Enum, size_t N>
const char* name_of(const std::array<std::pair<Enum, const char*>, N>& names, Enum value) {
  for (const auto& [v, spelling] : names) {
    if (v == value) return spelling;
  }
  return "?";
}

}  // namespace

StrictHandling parse_strict_handling(const std::string& name) {
  return parse_name(kStrictNames, name, "strict handling");
}
const char* strict_handling_name(StrictHandling mode) { return name_of(kStrictNames, mode); }
WriterPolicy parse_writer_policy(const std::string& name) { return parse_name(kWriterNames, name, "writer policy"); }
const char* writer_policy_name(WriterPolicy policy) { return name_of(kWriterNames, policy); }
LoadExchange parse_load_exchange(const std::string& name) { return parse_name(kExchangeNames, name, "load exchange"); }
const char* load_exchange_name(LoadExchange exchange) { return name_of(kExchangeNames, exchange); }

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
