// Evaluating layout expressions with partial knowledge of the config. The
// checker uses the traced form to point at the exact operation that fails;
// evaluate() and to_source() are the entry points for everyone else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace distckpt::gen {

struct Evaluation {
  enum class Failure { kNone, kInexactDivision, kDivisionByZero, kOverflow };
  std::optional<int64_t> value;  // nullopt: a parameter is unknown, or it failed
  Failure failure = Failure::kNone;
  const Expr* failed = nullptr;     // the operation that failed
  std::optional<int64_t> lhs, rhs;  // its operands, where known
};

// `values`: parameter index -> value (nullopt = unknown at this point).
// A division by a known zero fails even when the dividend is unknown.
Evaluation evaluate_traced(const Expr& expr, const std::vector<std::optional<int64_t>>& values);

// "+", "-", "*" or "/".
const char* op_symbol(Expr::Op op);

// True when the expression mentions any config parameter.
bool uses_params(const Expr& expr);

// Evaluates an expression with every parameter bound; nullopt if it uses a
// parameter with no value in `values` (index -> value, nullopt = unknown).
// Division by zero or inexact division yields nullopt and sets `error`.
std::optional<int64_t> evaluate(const Expr& expr, const std::vector<std::optional<int64_t>>& values,
                                std::string* error = nullptr);

// The expression as schema text with minimal parentheses ("(heads + 2 * kv_groups) * head_dim").
std::string to_source(const Expr& expr, const std::vector<ConfigParam>& params);

}  // namespace distckpt::gen
