// The front end of distckpt-gen: parse (PEGTL grammar -> syntax tree), then
// check (names, shapes, splits, conditions -> layout model).
#pragma once

#include <optional>
#include <string>

#include "diagnostics.h"
#include "ir/ir.h"

namespace distckpt::gen {

// Parses and checks one schema. Returns the layout, or nullopt when any
// error was reported to `diagnostics` (warnings do not fail).
std::optional<Layout> compile_schema(const std::string& file_name, const std::string& source, Diagnostics& diagnostics);

}  // namespace distckpt::gen
