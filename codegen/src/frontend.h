// The front end of distckpt-gen: parse (PEGTL grammar -> syntax tree), then
// check (names, shapes, splits, conditions -> layout model).
#pragma once

#include <optional>
#include <string>

#include "diagnostics.h"
#include "ir.h"

namespace distckpt::gen {

// Parses and checks one schema. Returns the layout, or nullopt when any
// error was reported to `diagnostics` (warnings do not fail).
std::optional<Layout> compile_schema(const std::string& file_name, const std::string& source,
                                     Diagnostics& diagnostics);

// Evaluates an expression with every parameter bound; nullopt if it uses a
// parameter with no value in `values` (index -> value, nullopt = unknown).
// Division by zero or inexact division yields nullopt and sets `error`.
std::optional<int64_t> evaluate(const Expr& expr, const std::vector<std::optional<int64_t>>& values,
                                std::string* error = nullptr);

// The expression as schema text with minimal parentheses ("(heads + 2 * kv_groups) * head_dim").
std::string to_source(const Expr& expr, const std::vector<ConfigParam>& params);

}  // namespace distckpt::gen
