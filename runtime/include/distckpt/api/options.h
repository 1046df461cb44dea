// Options of save and load: plain structs with defaults.
#pragma once

#include <cstdint>
#include <string>

namespace distckpt {

// What to do with keys that do not match between the request and the
// checkpoint (Megatron-Core StrictHandling). "Unexpected" keys are requested
// but absent from the checkpoint; "missing" keys are stored but requested by
// no rank (finding them costs one all-gather of the requested keys).
enum class StrictHandling {
  kAssumeOkUnexpected,  // no check; loading an absent key fails in the reader
  kLogUnexpected,       // warn about unexpected keys, skip them; ignore missing
  kLogAll,              // warn about both, skip unexpected
  kRaiseUnexpected,     // KeyMismatchError on unexpected keys before reading
  kRaiseAll,            // KeyMismatchError on any mismatch
  kReturnUnexpected,    // skip unexpected keys and return them
  kReturnAll,           // skip unexpected keys, return both sets
  kIgnoreAll,           // skip unexpected keys silently
};
// "assume_ok_unexpected", "log_unexpected", ... (Megatron's spellings).
StrictHandling parse_strict_handling(const std::string& name);
const char* strict_handling_name(StrictHandling mode);

struct SaveOptions {
  // Replace a committed checkpoint in the target directory. The old one is
  // removed only after the new one is committed, so a failed save loses nothing.
  bool overwrite = false;
  // Checksum granularity: loads verify every block they read.
  uint64_t checksum_block_size = uint64_t{1} << 20;
  // Recorded in the metadata (the generated API fills these).
  std::string layout_name;
  std::string layout_fingerprint;
  std::string layout_schema;
};

struct LoadOptions {
  StrictHandling strict = StrictHandling::kAssumeOkUnexpected;
  // Verify the checksum of every block read (cheap: XXH3 runs at memory speed).
  bool verify_checksums = true;
};

}  // namespace distckpt
