#include "distckpt/load/options.h"

#include "core/enum_names.h"

namespace distckpt {
namespace {

constexpr EnumNames<StrictHandling, 8> kStrictNames{{
    {StrictHandling::kAssumeOkUnexpected, "assume_ok_unexpected"},
    {StrictHandling::kLogUnexpected, "log_unexpected"},
    {StrictHandling::kLogAll, "log_all"},
    {StrictHandling::kRaiseUnexpected, "raise_unexpected"},
    {StrictHandling::kRaiseAll, "raise_all"},
    {StrictHandling::kReturnUnexpected, "return_unexpected"},
    {StrictHandling::kReturnAll, "return_all"},
    {StrictHandling::kIgnoreAll, "ignore_all"},
}};
constexpr EnumNames<LoadExchange, 4> kExchangeNames{{
    {LoadExchange::kAuto, "auto"},
    {LoadExchange::kNone, "none"},
    {LoadExchange::kBroadcast, "broadcast"},
    {LoadExchange::kAllGather, "all_gather"},
}};

}  // namespace

StrictHandling parse_strict_handling(const std::string& name) {
  return parse_enum_name(kStrictNames, name, "strict handling");
}
const char* strict_handling_name(StrictHandling mode) { return enum_name(kStrictNames, mode); }
LoadExchange parse_load_exchange(const std::string& name) {
  return parse_enum_name(kExchangeNames, name, "load exchange");
}
const char* load_exchange_name(LoadExchange exchange) { return enum_name(kExchangeNames, exchange); }

}  // namespace distckpt
