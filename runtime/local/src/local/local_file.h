// One rank's local checkpoint as a single file:
//   [64-byte header, padded to 4 KiB][tensor bytes][metadata: schema/local.fbs]
// The tensor bytes are written like a global save's data file (writer
// threads, O_DIRECT, 4 KiB-aligned items). The header (with its own checksum)
// says where the metadata is and gives its checksum; the metadata gives every
// tensor's byte range and per-block XXH3 checksums. Files are written under a temporary name, fsync'ed and renamed,
// so a file under its final name is always complete.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "distckpt/local/tensor_aware_state_dict.h"

namespace distckpt::local {

struct LocalFileHeader {
  int64_t iteration = 0;
  int32_t owner_rank = 0;
  int32_t world_size = 0;
  uint64_t meta_offset = 0;
  uint64_t meta_size = 0;
};

// Writes `state` (not hollow) as `path`; refuses to replace an existing file.
// Returns the file size.
uint64_t write_local_file(const TensorAwareStateDict& state, int64_t iteration, const std::string& path);

// Cheap completeness check: the header is intact and the file has the size it
// announces. nullopt (never throws) for anything else.
std::optional<LocalFileHeader> probe_local_file(const std::string& path);

// Reads the whole file, verifying the header, the metadata and every block
// of tensor bytes. Throws CorruptionError naming the file and what is wrong.
TensorAwareStateDict read_local_file(const std::string& path);

}  // namespace distckpt::local
