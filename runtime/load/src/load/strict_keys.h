// Strict handling of key mismatches between a load request and a checkpoint.
//
// Unexpected keys (requested here, not stored) are found by each rank alone.
// Missing keys (stored, requested by no rank: the *_ALL modes) are found
// without any rank holding every rank's keys: each rank routes its requested
// keys to their owners (inside an agreement the caller already runs), and
// the owners report the stored keys they own that no rank requested, to
// every rank when all read one checkpoint, else to the ranks that store
// them. A checkpoint's tensors are routed by their place in it (place modulo
// the world), so an owner decodes only its own records; other keys by digest
// (digest modulo the world), compared by 64-bit digest: a stored key whose
// digest equals a requested key's would go unreported (odds about 2^-64 per
// pair).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/load/options.h"
#include "load/checkpoint_reader.h"
#include "plan/messages.h"

namespace distckpt::loading {

struct KeyMismatch {
  std::set<std::string> unexpected;  // requested on this rank, not stored
  std::set<std::string> missing;     // stored, requested by no rank (only computed by *_ALL modes)
};

// What a checkpoint stores, for the checks: tensor keys, object keys and
// unique keys (which shards), and how messages name the checkpoint ("the
// checkpoint 'DIR'").
struct StoredKeys {
  // The tensor keys, all of them (a local checkpoint, a simulation) ...
  std::set<std::string> tensors;
  // ... or looked up in a checkpoint on storage, which no rank decodes whole:
  // keys are owned by their place in it (sorted by key), and an owner lists
  // only the keys it owns.
  struct Lookup {
    size_t count = 0;
    std::function<std::optional<size_t>(const std::string&)> find;
    std::function<std::string(size_t)> key_at;
  };
  std::optional<Lookup> lookup;
  std::set<std::string> object_keys;
  std::set<std::string> object_shards;  // ShardedObject::unique_key()
  std::string where;
  // Each rank stores other keys (its local checkpoint), not one checkpoint's.
  bool per_rank = false;
  void add_object(const std::string& key, std::string unique_key) {
    object_keys.insert(key);
    object_shards.insert(std::move(unique_key));
  }
  bool has_tensor(const std::string& key) const {
    return lookup ? lookup->find(key).has_value() : tensors.count(key) > 0;
  }
};
// Looks tensors up in `reader` (which must outlive the result).
StoredKeys stored_keys_of(const CheckpointReader& reader);

// Whether handle_key_mismatch is collective in `mode` (the *_ALL modes).
bool key_check_is_collective(StrictHandling mode);

// The *_ALL modes' first step, not collective: part o for rank o, the
// digests of the requested keys it owns (and of the stored ones it owns,
// when `stored.per_rank`). The caller moves them in an all-to-all.
std::vector<std::string> route_key_digests(const Value& sharded, const StoredKeys& stored, int world);

// The owner's step (not collective), from what every rank routed here: the
// stored keys this rank owns that no rank requested, by name (one
// checkpoint every rank reads) ...
plan::UnrequestedKeys owned_unrequested_keys(const StoredKeys& stored, const std::vector<std::string>& routed, int me,
                                             int world);
// ... or, when each rank stores other keys, part r for rank r: the digests
// rank r asked about that no rank requested.
std::vector<std::string> answer_stored_key_questions(const std::vector<std::string>& routed, int world);

// run_agreed(comm, phase, step); in the *_ALL modes the same collective also
// routes the digests of `sharded`'s and `stored`'s keys (filled by `step`)
// to their owners and returns what this rank owns, by sender.
std::vector<std::string> agreed_routing_keys(Communicator& comm, const std::string& phase, StrictHandling mode,
                                             const std::function<void()>& step, const Value& sharded,
                                             const StoredKeys& stored);

// Keys are reported as Megatron does: tensor and object keys, not shards. A
// requested shard that is not stored is skipped (where the mode skips) and
// its key reported unexpected; a stored key no rank requests is missing.
// The *_ALL modes are collective: `routed` is what every rank routed here
// (route_key_digests), and one agreed collective brings the owners' answers.
// Applies `mode`: raises KeyMismatchError, logs, and removes unexpected
// entries from `sharded` where the mode says to skip them. Returns what was
// found, the same on every rank but for the unexpected keys.
KeyMismatch handle_key_mismatch(Value& sharded, const StoredKeys& stored, Communicator& comm, StrictHandling mode,
                                const std::vector<std::string>& routed = {});

}  // namespace distckpt::loading
