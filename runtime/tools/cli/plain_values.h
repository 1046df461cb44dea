// Values and names read from checkpoints (untrusted: any bytes), as the
// CLI prints them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "distckpt/core/state_dict.h"

namespace distckpt::cli {

// A name fit for one line of a table: control bytes escaped.
std::string printable(const std::string& text);
// A plain value as Python would print it; strings quoted as JSON quotes
// them (escapes included); containers and tensors by their kind.
std::string plain_text(const Value& v);
// The same as a JSON value.
nlohmann::json plain_json(const Value& v);

}  // namespace distckpt::cli
