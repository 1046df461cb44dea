// Encoding of a LocalState (schema/local.fbs): the metadata block of a local
// checkpoint file and what a hollow TensorAwareStateDict serialises to.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "distckpt/format/local_state.h"

namespace distckpt {

constexpr uint32_t kLocalFormatVersion = 1;

std::string encode_local_state(const LocalState& state);
// Verifies the buffer, then every record: metadata integrity of each tensor,
// byte lengths against dtype x shape, checksum counts against the block size.
LocalState decode_local_state(std::string_view bytes, const std::string& origin);

}  // namespace distckpt
