// The checker: syntax tree -> layout model. Resolves every name (config
// parameters, mesh axes, keys), checks shapes, splits, placement and
// conditions, and reports each problem at the token it concerns.
#pragma once

#include <optional>

#include "diagnostics.h"
#include "ir/ir.h"
#include "syntax/ast.h"

namespace distckpt::gen {

// The layout, or nullopt when an error was reported (warnings do not
// fail). Fills neither Layout::file_name nor Layout::source_text.
std::optional<Layout> check_schema(const ast::Schema& schema, Diagnostics& diagnostics);

}  // namespace distckpt::gen
