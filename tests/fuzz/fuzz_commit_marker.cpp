// Fuzzes the commit marker parser (metadata.json, format/commit.h): any text
// must either be rejected with CheckpointError or give a configuration that
// keeps what the parser promises. Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
#include "format/commit.h"
#include "format/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  distckpt::CheckpointConfig config;
  try {
    config = distckpt::parse_commit_marker(text, "metadata.json");
  } catch (const distckpt::CheckpointError&) {
    return 0;
  }
  const bool kept = config.format == distckpt::kFormatName && config.version >= 1 &&
                    config.version <= static_cast<int>(distckpt::kFormatVersion) && config.world_size >= 1;
  if (!kept) std::abort();
  return 0;
}
