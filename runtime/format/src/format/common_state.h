// Encoding of the common (non-sharded) part of a state dict: nested dicts and
// lists of None/bool/int/float/string/tensor (CPU copies), as FlatBuffers.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "distckpt/core/state_dict.h"

namespace distckpt {

// Throws UsageError if a tree holds a sharded entry (they never belong here).
// `content_metadata` (SaveOptions::content_metadata) travels in the same file.
std::string encode_common_state(const Value& common, const std::optional<Value>& content_metadata = std::nullopt);
// Verifies the buffer; tensor byte sizes are checked against dtype x shape.
Value decode_common_state(std::string_view bytes, const std::string& origin);
// The content metadata the buffer carries; nullopt when it has none.
std::optional<Value> decode_content_metadata(std::string_view bytes, const std::string& origin);

}  // namespace distckpt
