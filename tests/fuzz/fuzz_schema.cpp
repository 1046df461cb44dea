// Fuzzes the front end of distckpt-gen: the schema parser and the checker
// (codegen/src/syntax, codegen/src/check) on arbitrary source text, then the
// rendering of whatever they reported. Errors are diagnostics, never
// exceptions or crashes; a rejected schema always carries an error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "diagnostics.h"
#include "frontend.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  distckpt::gen::Diagnostics diagnostics("fuzz.shard", source);
  const auto layout = distckpt::gen::compile_schema("fuzz.shard", source, diagnostics);
  if (!layout && !diagnostics.has_errors()) std::abort();
  (void)diagnostics.render();
  return 0;
}
