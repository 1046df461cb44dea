#include "plain_values.h"

#include <fmt/format.h>

namespace distckpt::cli {

std::string printable(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    out += byte < 0x20 || byte == 0x7f ? fmt::format("\\x{:02x}", byte) : std::string(1, c);
  }
  return out;
}

std::string plain_text(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.as_int());
    case Kind::kFloat:
      return fmt::format("{}", v.as_float());
    case Kind::kString:
      return nlohmann::json(v.as_string()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    default:
      return fmt::format("({})", kind_name(v.kind()));
  }
}

nlohmann::json plain_json(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone:
      return nullptr;
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int();
    case Kind::kFloat:
      return v.as_float();
    case Kind::kString:
      return v.as_string();
    default:
      return fmt::format("({})", kind_name(v.kind()));
  }
}

}  // namespace distckpt::cli
