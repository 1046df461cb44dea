// C++ keywords and reserved identifiers (see cpp_identifiers.h).
#include "check/cpp_identifiers.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace distckpt::gen {
namespace {

// C++20's keywords and alternative tokens, so the generated code also
// compiles as C++20. (Schema keywords such as `int` never get this far.)
constexpr std::array<std::string_view, 92> kKeywords = {
    "alignas",     "alignof",  "and",        "and_eq",    "asm",       "auto",         "bitand",
    "bitor",       "bool",     "break",      "case",      "catch",     "char",         "char16_t",
    "char32_t",    "char8_t",  "class",      "co_await",  "co_return", "co_yield",     "compl",
    "concept",     "const",    "const_cast", "consteval", "constexpr", "constinit",    "continue",
    "decltype",    "default",  "delete",     "do",        "double",    "dynamic_cast", "else",
    "enum",        "explicit", "export",     "extern",    "false",     "float",        "for",
    "friend",      "goto",     "if",         "inline",    "int",       "long",         "mutable",
    "namespace",   "new",      "noexcept",   "not",       "not_eq",    "nullptr",      "operator",
    "or",          "or_eq",    "private",    "protected", "public",    "register",     "reinterpret_cast",
    "requires",    "return",   "short",      "signed",    "sizeof",    "static",       "static_assert",
    "static_cast", "struct",   "switch",     "template",  "this",      "thread_local", "throw",
    "true",        "try",      "typedef",    "typeid",    "typename",  "union",        "unsigned",
    "using",       "virtual",  "void",       "volatile",  "wchar_t",   "while",        "xor",
    "xor_eq"};

}  // namespace

std::string identifier_problem(std::string_view name, CppScope scope) {
  if (std::find(kKeywords.begin(), kKeywords.end(), name) != kKeywords.end()) return ", which is a C++ keyword";
  // Compilers and standard libraries name their own things `__x` and `_X`.
  // A double underscore inside a name is reserved by the letter of the
  // standard too, but nothing uses it there, and Megatron-style keys need it
  // (`core_attention._extra_state` -> `core_attention__extra_state`).
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') {
    return ", which C++ reserves for the implementation (it begins with '__')";
  }
  if (name.size() >= 2 && name[0] == '_' && std::isupper(static_cast<unsigned char>(name[1]))) {
    return ", which C++ reserves for the implementation (it begins with '_' and an uppercase letter)";
  }
  if (scope == CppScope::kNamespace && !name.empty() && name[0] == '_') {
    return ", which C++ reserves for the implementation at global scope (it begins with '_')";
  }
  // Namespaces the generated code names: Model would land among their names.
  if (scope == CppScope::kNamespace &&
      (name == "std" || name == "at" || name == "c10" || name == "torch" || name == "distckpt" || name == "fmt")) {
    return ", which the generated code uses for a library of its own";
  }
  return "";
}

}  // namespace distckpt::gen
