// Emits the typed C++ API of a layout: a header (Config, Mesh, Model with
// one typed setter per tensor, stack element classes, optimizer classes) and
// a source file that declares every slot through distckpt::layout::Builder.
#pragma once

#include <string>

#include "ir/ir.h"

namespace distckpt::gen {

struct GeneratedFiles {
  std::string header;
  std::string source;
};

// `header_name` is how the source includes the header ("gpt.shard.h").
GeneratedFiles emit_cpp(const Layout& layout, const std::string& header_name);

// XXH3-64 of the schema text as 16 hex digits: identifies the layout in checkpoints.
std::string layout_fingerprint(const std::string& source_text);

}  // namespace distckpt::gen
