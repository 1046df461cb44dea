#include "distckpt/api/options.h"

#include <array>
#include <utility>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

constexpr std::array<std::pair<StrictHandling, const char*>, 8> kNames{{
    {StrictHandling::kAssumeOkUnexpected, "assume_ok_unexpected"},
    {StrictHandling::kLogUnexpected, "log_unexpected"},
    {StrictHandling::kLogAll, "log_all"},
    {StrictHandling::kRaiseUnexpected, "raise_unexpected"},
    {StrictHandling::kRaiseAll, "raise_all"},
    {StrictHandling::kReturnUnexpected, "return_unexpected"},
    {StrictHandling::kReturnAll, "return_all"},
    {StrictHandling::kIgnoreAll, "ignore_all"},
}};

}  // namespace

StrictHandling parse_strict_handling(const std::string& name) {
  for (const auto& [mode, spelling] : kNames) {
    if (name == spelling) return mode;
  }
  std::string all;
  for (const auto& entry : kNames) all += std::string(all.empty() ? "" : ", ") + entry.second;
  throw Error(fmt::format("unknown strict handling '{}'; use one of: {}", name, all));
}

const char* strict_handling_name(StrictHandling mode) {
  for (const auto& [m, spelling] : kNames) {
    if (m == mode) return spelling;
  }
  return "?";
}

}  // namespace distckpt
