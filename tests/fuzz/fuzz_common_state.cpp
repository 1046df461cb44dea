// Fuzzes the common state reader (common.fb): decode_common_state must either
// throw CheckpointError or return a tree that encodes and decodes back to
// the same bytes. Anything else (another exception, a crash) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
#include "format/common_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  distckpt::Value common;
  try {
    common = distckpt::decode_common_state(bytes, "common.fb");
  } catch (const distckpt::CheckpointError&) {
    return 0;
  }
  const std::string encoded = distckpt::encode_common_state(common);
  if (distckpt::encode_common_state(distckpt::decode_common_state(encoded, "re-encoded")) != encoded) std::abort();
  return 0;
}
