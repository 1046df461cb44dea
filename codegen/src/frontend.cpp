// compile_schema: parse, then check. The checker only runs on a schema that
// parsed cleanly: a dropped statement would make it report names as unknown
// that are merely misspelled elsewhere.
#include "frontend.h"

#include "check/checker.h"
#include "syntax/parser.h"

namespace distckpt::gen {

std::optional<Layout> compile_schema(const std::string& file_name, const std::string& source,
                                     Diagnostics& diagnostics) {
  const ast::Schema schema = parse_schema(source, diagnostics);
  if (diagnostics.has_errors()) return std::nullopt;
  std::optional<Layout> layout = check_schema(schema, diagnostics);
  if (!layout) return std::nullopt;
  layout->file_name = file_name;
  layout->source_text = source;
  return layout;
}

}  // namespace distckpt::gen
