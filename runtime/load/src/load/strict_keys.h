// Strict handling of key mismatches between a load request and a checkpoint.
#pragma once

#include <set>
#include <string>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/load/options.h"
#include "load/checkpoint_reader.h"

namespace distckpt::loading {

struct KeyMismatch {
  std::set<std::string> unexpected;  // requested on this rank, not stored
  std::set<std::string> missing;     // stored, requested by no rank (only computed by *_ALL modes)
};

// What a checkpoint stores, for the checks: tensor keys, object keys and
// unique keys (which shards), and how messages name the checkpoint ("the
// checkpoint 'DIR'").
struct StoredKeys {
  std::set<std::string> tensors;
  std::set<std::string> object_keys;
  std::set<std::string> object_shards;  // ShardedObject::unique_key()
  std::string where;
  void add_object(const std::string& key, std::string unique_key) {
    object_keys.insert(key);
    object_shards.insert(std::move(unique_key));
  }
};

// Whether handle_key_mismatch is collective in `mode` (the *_ALL modes).
bool key_check_is_collective(StrictHandling mode);

// Keys are reported as Megatron does: tensor and object keys, not shards. A
// requested shard that is not stored is skipped (where the mode skips) and
// its key reported unexpected; a stored key no rank requests is missing.
// Collective for the *_ALL modes (one all-gather of requested keys). Applies
// `mode`: raises KeyMismatchError, logs, and removes unexpected entries from
// `sharded` where the mode says to skip them. Returns what was found.
KeyMismatch handle_key_mismatch(Value& sharded, const CheckpointReader& reader, Communicator& comm,
                                StrictHandling mode);
KeyMismatch handle_key_mismatch(Value& sharded, const StoredKeys& stored, Communicator& comm, StrictHandling mode);

}  // namespace distckpt::loading
