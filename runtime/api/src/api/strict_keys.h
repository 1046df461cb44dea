// Strict handling of key mismatches between a load request and a checkpoint.
#pragma once

#include <set>
#include <string>

#include "api/checkpoint_reader.h"
#include "distckpt/api/options.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"

namespace distckpt::api {

struct KeyMismatch {
  std::set<std::string> unexpected;  // requested on this rank, not stored
  std::set<std::string> missing;     // stored, requested by no rank (only computed by *_ALL modes)
};

// What a checkpoint stores, for the checks: tensor keys, object unique keys,
// and how messages name the checkpoint ("the checkpoint 'DIR'").
struct StoredKeys {
  std::set<std::string> tensors;
  std::set<std::string> objects;
  std::string where;
};

// Collective for the *_ALL modes (one all-gather of requested keys). Applies
// `mode`: raises KeyMismatchError, logs, and removes unexpected entries from
// `sharded` where the mode says to skip them. Returns what was found.
KeyMismatch handle_key_mismatch(Value& sharded, const CheckpointReader& reader, Communicator& comm,
                                StrictHandling mode);
KeyMismatch handle_key_mismatch(Value& sharded, const StoredKeys& stored, Communicator& comm, StrictHandling mode);

}  // namespace distckpt::api
