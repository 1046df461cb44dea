// Parser of the layout schema language: source text -> syntax tree. Syntax
// errors go to `diagnostics`; a statement with an error is dropped and
// parsing goes on with the next one, so one run reports all of them.
#pragma once

#include <string>

#include "diagnostics.h"
#include "syntax/ast.h"

namespace distckpt::gen {

// Everything that parsed; check diagnostics.has_errors() before trusting
// that it is the whole schema.
ast::Schema parse_schema(const std::string& source, Diagnostics& diagnostics);

}  // namespace distckpt::gen
