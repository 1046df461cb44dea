// Encoding of the common (non-sharded) part of a state dict: nested dicts and
// lists of None/bool/int/float/string/tensor (CPU copies), as FlatBuffers.
#pragma once

#include <string>
#include <string_view>

#include "distckpt/core/state_dict.h"

namespace distckpt {

// Throws Error if the tree holds a sharded entry (they never belong here).
std::string encode_common_state(const Value& common);
// Verifies the buffer; tensor byte sizes are checked against dtype x shape.
Value decode_common_state(std::string_view bytes, const std::string& origin);

}  // namespace distckpt
