// C++ names derived from schema names (see cpp_names.h).
#include "ir/cpp_names.h"

#include <algorithm>
#include <cctype>

namespace distckpt::gen {

std::string accessor_name(std::string_view key) {
  std::string out(key);
  std::replace(out.begin(), out.end(), '.', '_');
  return out;
}

std::string class_name(std::string_view name) {
  std::string out;
  bool start_of_word = true;
  for (const char c : name) {
    if (c == '_' || c == '.') {
      start_of_word = true;
      continue;
    }
    out += start_of_word ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    start_of_word = false;
  }
  return out;
}

std::string axis_constant(std::string_view axis) { return "k" + class_name(axis); }

std::string mesh_constant(std::string_view mesh) { return axis_constant(mesh) + "Mesh"; }

}  // namespace distckpt::gen
