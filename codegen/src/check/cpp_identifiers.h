// Which schema names cannot be C++ names of the generated code: keywords and
// the identifiers C++ reserves for its implementation.
#pragma once

#include <string>
#include <string_view>

namespace distckpt::gen {

enum class CppScope { kMember, kNamespace };

// Why `name` cannot name a member (or, at kNamespace, a namespace at global
// scope): ", which is a C++ keyword", ", which C++ reserves ...". Empty when
// it can.
std::string identifier_problem(std::string_view name, CppScope scope = CppScope::kMember);

}  // namespace distckpt::gen
