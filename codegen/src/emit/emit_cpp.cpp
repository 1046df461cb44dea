#include "emit/emit_cpp.h"

#include <fmt/format.h>
#include <xxhash.h>

namespace distckpt::gen {

std::string layout_fingerprint(const std::string& source_text) {
  return fmt::format("{:016x}", XXH3_64bits(source_text.data(), source_text.size()));
}

GeneratedFiles emit_cpp(const Layout& layout, const std::string& header_name) {
  return GeneratedFiles{emit_header(layout), emit_source(layout, header_name)};
}

}  // namespace distckpt::gen
