// Expression evaluation (exact integer arithmetic, as the generated code
// does it at run time) and printing back to schema text.
#include "ir/expr.h"

#include <fmt/format.h>

#include <limits>
#include <string>

namespace distckpt::gen {
namespace {

Evaluation fail(Evaluation::Failure failure, const Expr& at, std::optional<int64_t> lhs, std::optional<int64_t> rhs) {
  Evaluation result;
  result.failure = failure;
  result.failed = &at;
  result.lhs = lhs;
  result.rhs = rhs;
  return result;
}

Evaluation known(int64_t value) {
  Evaluation result;
  result.value = value;
  return result;
}

// Binding strength for printing: sums < products < operands.
int precedence(const Expr& e) {
  switch (e.op) {
    case Expr::Op::kAdd:
    case Expr::Op::kSub:
      return 1;
    case Expr::Op::kMul:
    case Expr::Op::kDiv:
      return 2;
    default:
      return 3;
  }
}

}  // namespace

const char* op_symbol(Expr::Op op) {
  switch (op) {
    case Expr::Op::kAdd:
      return "+";
    case Expr::Op::kSub:
      return "-";
    case Expr::Op::kMul:
      return "*";
    default:
      return "/";
  }
}

Evaluation evaluate_traced(const Expr& e, const std::vector<std::optional<int64_t>>& values) {
  switch (e.op) {
    case Expr::Op::kConst:
      return known(e.value);
    case Expr::Op::kParam: {
      const bool bound = e.param >= 0 && static_cast<size_t>(e.param) < values.size() && values[e.param];
      return bound ? known(*values[e.param]) : Evaluation{};
    }
    default:
      break;
  }
  if (!e.lhs || !e.rhs) return Evaluation{};
  const Evaluation lhs = evaluate_traced(*e.lhs, values);
  if (lhs.failure != Evaluation::Failure::kNone) return lhs;
  const Evaluation rhs = evaluate_traced(*e.rhs, values);
  if (rhs.failure != Evaluation::Failure::kNone) return rhs;
  if (e.op == Expr::Op::kDiv && rhs.value == 0) {
    return fail(Evaluation::Failure::kDivisionByZero, e, lhs.value, rhs.value);
  }
  if (!lhs.value || !rhs.value) return Evaluation{};
  const int64_t a = *lhs.value;
  const int64_t b = *rhs.value;
  int64_t result = 0;
  bool overflow = false;
  switch (e.op) {
    case Expr::Op::kAdd:
      overflow = __builtin_add_overflow(a, b, &result);
      break;
    case Expr::Op::kSub:
      overflow = __builtin_sub_overflow(a, b, &result);
      break;
    case Expr::Op::kMul:
      overflow = __builtin_mul_overflow(a, b, &result);
      break;
    default:
      overflow = a == std::numeric_limits<int64_t>::min() && b == -1;
      if (!overflow && a % b != 0) return fail(Evaluation::Failure::kInexactDivision, e, a, b);
      if (!overflow) result = a / b;
      break;
  }
  if (overflow) return fail(Evaluation::Failure::kOverflow, e, a, b);
  return known(result);
}

bool uses_params(const Expr& e) {
  if (e.op == Expr::Op::kParam) return true;
  return (e.lhs && uses_params(*e.lhs)) || (e.rhs && uses_params(*e.rhs));
}

std::optional<int64_t> evaluate(const Expr& expr, const std::vector<std::optional<int64_t>>& values,
                                std::string* error) {
  const Evaluation result = evaluate_traced(expr, values);
  if (result.failure == Evaluation::Failure::kNone || error == nullptr) return result.value;
  const std::string lhs = result.lhs ? std::to_string(*result.lhs) : std::string("?");
  const std::string rhs = result.rhs ? std::to_string(*result.rhs) : std::string("?");
  const char* op = op_symbol(result.failed->op);
  switch (result.failure) {
    case Evaluation::Failure::kInexactDivision:
      *error = fmt::format("'{} / {}' is not an exact division", lhs, rhs);
      break;
    case Evaluation::Failure::kDivisionByZero:
      *error = fmt::format("division by zero in '{} / {}'", lhs, rhs);
      break;
    default:
      *error = fmt::format("'{} {} {}' overflows a 64-bit integer", lhs, op, rhs);
      break;
  }
  return std::nullopt;
}

std::string to_source(const Expr& e, const std::vector<ConfigParam>& params) {
  switch (e.op) {
    case Expr::Op::kConst:
      return std::to_string(e.value);
    case Expr::Op::kParam:
      if (e.param >= 0 && static_cast<size_t>(e.param) < params.size()) return params[e.param].name;
      return fmt::format("<parameter {}>", e.param);
    default:
      break;
  }
  if (!e.lhs || !e.rhs) return "<incomplete>";
  // Operators are left-associative: a right operand of equal strength needs
  // parentheses ("a - (b - c)"), a left one does not ("a - b - c").
  const int mine = precedence(e);
  std::string lhs = to_source(*e.lhs, params);
  std::string rhs = to_source(*e.rhs, params);
  if (precedence(*e.lhs) < mine) lhs = "(" + lhs + ")";
  if (precedence(*e.rhs) <= mine) rhs = "(" + rhs + ")";
  return fmt::format("{} {} {}", lhs, op_symbol(e.op), rhs);
}

}  // namespace distckpt::gen
