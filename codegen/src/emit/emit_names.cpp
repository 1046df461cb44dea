#include "emit/emit_names.h"

#include <cctype>

namespace distckpt::gen {

// "decoder.layers" -> "DecoderLayers"
std::string camel_case(const std::string& dotted) {
  std::string out;
  bool upper = true;
  for (char c : dotted) {
    if (c == '.' || c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c);
    upper = false;
  }
  return out;
}

std::string axis_constant(const std::string& axis) { return "k" + camel_case(axis); }

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string common_type(CommonDecl::Type t) {
  switch (t) {
    case CommonDecl::Type::kInt:
      return "int64_t";
    case CommonDecl::Type::kFloat:
      return "double";
    case CommonDecl::Type::kString:
      return "std::string";
    case CommonDecl::Type::kBool:
      return "bool";
  }
  return "int64_t";
}

}  // namespace distckpt::gen
