// The distckpt entry points: save (distckpt/save/save.h) a sharded state dict
// from every rank, load it back under any other layout (distckpt/load/load.h),
// and the offline tools below, which read checkpoints without a model.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/format/storage_index.h"
#include "distckpt/load/load.h"
#include "distckpt/save/save.h"
#include "distckpt/storage/storage_reader.h"
#include "distckpt/storage/storage_writer.h"

namespace distckpt {

// The common (non-sharded) state the coordinator saved. No communication.
StateDict load_common_state_dict(const std::string& dir);

// The dict saved as SaveOptions::content_metadata; nullopt when the save
// gave none. For safetensors, {"format": F} when the files name the
// framework they are for (Hugging Face writes "pt"); nullopt for a
// torch.save file. Reads only the small common file (or the headers).
std::optional<StateDict> load_content_metadata(const std::string& dir);

// Every stored tensor as a metadata-only ShardedTensor covering the whole
// global shape (key, dtype, global shape), keyed by tensor key. No data read.
StateDict load_tensors_metadata(const std::string& dir);

// Loads only the ShardedObjects of `sharded_state_dict` (other entries are
// dropped); each comes back as its bytes.
StateDict load_sharded_objects(const StateDict& sharded_state_dict, const std::string& dir);

// Every stored tensor whole (no layout needed), keyed by tensor key. Meant for
// conversion and inspection on one process; needs memory for all tensors.
StateDict load_plain_tensors(const std::string& dir);

// Which tensors load_plain_tensors and load_tensors_metadata read: those
// named in `keys` and those whose key starts with one of `prefixes`. A key
// not stored, or a prefix no stored key starts with, is a CheckpointError (a
// typo, not an empty result).
struct TensorSelection {
  std::vector<std::string> keys;
  std::vector<std::string> prefixes;
};
StateDict load_plain_tensors(const std::string& dir, const TensorSelection& selection);
// load_tensors_metadata for the selected tensors: in the distckpt format only
// their records are decoded, whatever the checkpoint's size.
StateDict load_tensors_metadata(const std::string& dir, const TensorSelection& selection);
// One stored tensor, whole.
at::Tensor load_plain_tensor(const std::string& dir, const std::string& key);

// Every stored ShardedObject without its bytes (key, shard grid, offset),
// keyed by unique key (KEY/shard_OFFSET_SHAPE). No data read.
StateDict load_sharded_objects_metadata(const std::string& dir);
// Every stored ShardedObject with its bytes, keyed by unique key.
StateDict load_all_sharded_objects(const std::string& dir);

// Removes the tensors and objects whose key starts with `key_prefix` from a
// committed checkpoint (metadata rewritten atomically; data files no longer
// referenced are deleted). Run on one process. Returns how many keys were
// removed (an object's shards count once); an empty prefix is an Error.
size_t remove_sharded_tensors(const std::string& dir, const std::string& key_prefix);

// Checks everything a load would, on one process: the commit marker, the
// metadata (its recorded checksum, every offset and size), every file's
// size, the common state decoded, that every tensor's chunks tile its global
// shape, and every block of every tensor chunk and object against its
// checksum. Problems in data blocks are all listed; a damaged marker or
// metadata stops the check (nothing after it can be trusted).
VerifyReport verify_checkpoint(const std::string& dir, const VerifyProgress& progress = {});

struct TensorDigest {
  std::string key;
  std::string dtype;  // "float32"
  Shape shape;
  // The sum over its elements of a 64-bit hash of each one's global index
  // and bytes: the digest transfer() compares, summed from any parts.
  uint64_t hash;
  std::string line() const;  // "KEY DTYPE [2,3] 0123456789abcdef"
};
// One digest per stored tensor, sorted by key. The hash covers the logical
// (unsharded) tensor, so the same state saved under any layout digests the
// same. Streams in bounded windows: memory stays O(window), not O(tensor).
std::vector<TensorDigest> digest_checkpoint(const std::string& dir);

}  // namespace distckpt
