// Names in messages: "'a', 'b', ... and 7 more", at most `shown` of them, so
// an error about thousands of keys stays readable.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>

namespace distckpt {

template <typename Names>
std::string quoted_list(const Names& names, size_t shown = 20) {
  std::string out;
  size_t n = 0;
  for (const auto& name : names) {
    if (n++ == shown) {
      out += fmt::format(", ... and {} more", names.size() - shown);
      break;
    }
    out += (out.empty() ? "'" : ", '") + name + "'";
  }
  return out;
}

}  // namespace distckpt
