// Entry point of the parser: runs the grammar with the tree-building actions
// and the error-reporting control over one schema.
#include "syntax/parser.h"

#include <tao/pegtl.hpp>

#include "syntax/parse_state.h"
#include "syntax/parser_actions.h"
#include "syntax/syntax_errors.h"

namespace distckpt::gen {

ast::Schema parse_schema(const std::string& source, Diagnostics& diagnostics) {
  tao::pegtl::memory_input<> input(source, diagnostics.file_name());
  ParseState state(diagnostics);
  try {
    tao::pegtl::parse<grammar::schema, action, grammar::control>(input, state);
  } catch (const tao::pegtl::parse_error& error) {
    // recover<> catches every error inside a statement; this is a safety net
    // so a grammar change can never turn a syntax error into a crash.
    state.abandon(0, error);
  }
  return std::move(state.schema);
}

}  // namespace distckpt::gen
