// An option's spellings (a table of enum value -> name): parsed with an error
// that lists every accepted name, and printed.
#pragma once

#include <fmt/format.h>

#include <array>
#include <string>
#include <utility>

#include "distckpt/core/errors.h"

namespace distckpt {

template <typename Enum, size_t N>
using EnumNames = std::array<std::pair<Enum, const char*>, N>;

// UsageError naming `what` and the accepted spellings for an unknown `name`.
template <typename Enum, size_t N>
Enum parse_enum_name(const EnumNames<Enum, N>& names, const std::string& name, const char* what) {
  std::string all;
  for (const auto& [value, spelling] : names) {
    if (name == spelling) return value;
    all += std::string(all.empty() ? "" : ", ") + spelling;
  }
  throw UsageError(fmt::format("unknown {} '{}'; use one of: {}", what, name, all));
}

template <typename Enum, size_t N>
const char* enum_name(const EnumNames<Enum, N>& names, Enum value) {
  for (const auto& [v, spelling] : names) {
    if (v == value) return spelling;
  }
  return "?";
}

}  // namespace distckpt
