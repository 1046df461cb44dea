// Spelling expressions, conditions and axes in generated C++ (see emit_context.h).
#include "emit/emit_context.h"

#include <fmt/format.h>

#include "ir/cpp_names.h"
#include "ir/expr.h"

namespace distckpt::gen {

std::string EmitContext::cpp(const Expr& expr) const { return cpp(expr, 0); }

std::string EmitContext::cpp(const Expr& e, int parent_precedence) const {
  switch (e.op) {
    case Expr::Op::kConst:
      return std::to_string(e.value);
    case Expr::Op::kParam:
      return "c." + layout_.params[e.param].name;
    case Expr::Op::kDiv:
      return fmt::format("distckpt::layout::exact_div({}, {}, {})", cpp(*e.lhs), cpp(*e.rhs), quoted(schema(e)));
    default: {
      const bool additive = e.op == Expr::Op::kAdd || e.op == Expr::Op::kSub;
      const int precedence = additive ? 1 : 2;
      const char* op = e.op == Expr::Op::kAdd ? " + " : e.op == Expr::Op::kSub ? " - " : " * ";
      // The right operand of '-' needs parentheses at equal precedence.
      std::string text = cpp(*e.lhs, precedence) + op + cpp(*e.rhs, precedence + (e.op == Expr::Op::kSub));
      return precedence < parent_precedence ? "(" + text + ")" : text;
    }
  }
}

std::string EmitContext::schema(const Expr& expr) const { return to_source(expr, layout_.params); }

std::string EmitContext::axis_constant(int index) const { return gen::axis_constant(layout_.mesh_axes[index]); }

std::string EmitContext::axis_names() const { return comma_list(layout_.mesh_axes, quoted); }

std::string EmitContext::axis_coords() const {
  std::vector<std::string> coords;
  for (const std::string& axis : layout_.mesh_axes) coords.push_back("mesh." + axis);
  return comma_list(coords);
}

std::string EmitContext::mesh_constant(int index) const { return gen::mesh_constant(layout_.meshes.at(index).name); }

std::string EmitContext::first_chunk_prefix() const {
  return layout_.chunked_stack ? "distckpt::layout::chunk_prefix(0)" : "";
}

std::string EmitContext::last_chunk_prefix() const {
  return layout_.chunked_stack ? "distckpt::layout::chunk_prefix(chunks_ - 1)" : "";
}

std::string EmitContext::condition_test(const Condition& c) const {
  if (c.param < 0) return "";
  return fmt::format("c.{} {} 0", layout_.params[c.param].name, c.negate ? "==" : "!=");
}

std::string EmitContext::condition_text(const Condition& c) const {
  if (c.param < 0) return "";
  return fmt::format(" {} {}", c.negate ? "unless" : "when", layout_.params[c.param].name);
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string common_type(CommonDecl::Type type) {
  switch (type) {
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

std::string comma_list(const std::vector<std::string>& parts, std::string (*quote)(const std::string&)) {
  std::string out;
  for (const std::string& part : parts) {
    if (part.empty()) continue;
    out += (out.empty() ? "" : ", ") + (quote ? quote(part) : part);
  }
  return out;
}

Guard::Guard(Printer& p, const std::vector<std::string>& tests) : p_(p) {
  std::string joined;
  for (const std::string& test : tests) {
    if (!test.empty()) joined += (joined.empty() ? "" : " && ") + test;
  }
  if (joined.empty()) return;
  p_.print("if ($tests$) {\n", "tests", joined);
  p_.indent();
  open_ = true;
}

Guard::~Guard() {
  if (!open_) return;
  p_.outdent();
  p_.print("}\n");
}

}  // namespace distckpt::gen
