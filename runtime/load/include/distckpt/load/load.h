// load(): every rank reads the parts of a checkpoint its request overlaps,
// under any layout.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/load/options.h"
#include "distckpt/storage/storage_reader.h"

namespace distckpt {

struct LoadResult {
  StateDict state_dict;                   // common state merged with the loaded entries
  std::set<std::string> missing_keys;     // stored but requested by no rank (*_ALL modes)
  std::set<std::string> unexpected_keys;  // requested here but not stored
  uint64_t bytes_read = 0;                // from storage by this rank (whole checksum blocks when verifying)
};

// Collective. `sharded_state_dict` describes what this rank wants, in any
// layout: ShardedTensors are filled in place when they carry data (else
// allocated), ShardedObjects come back as their bytes, factories are merged,
// non-persistent values put back, and the common state merged in. With
// LoadOptions::exchange (the default), a stored piece several ranks need is
// read from storage once and sent to the others.
// `dir` is a distckpt checkpoint or Hugging Face safetensors (a file, or a
// directory with an index or one file): LoadOptions::format, detected by
// default. Each rank reads only the stored bytes its shards overlap.
LoadResult load(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
                const LoadOptions& options = {});
// The same from a storage the caller opened (e.g. its own StorageReader).
LoadResult load(const StateDict& sharded_state_dict, StorageReader& storage, Communicator& comm,
                const LoadOptions& options = {});

}  // namespace distckpt
