// The distckpt entry points: save a sharded state dict from every rank, load
// it back under any other layout, and inspect checkpoints without a model.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "distckpt/api/options.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/format/storage_index.h"
#include "distckpt/storage/storage_reader.h"
#include "distckpt/storage/storage_writer.h"

namespace distckpt {

struct SaveReport {
  bool plan_reused = false;    // planning skipped: every rank matched SaveOptions::plan_cache
  uint64_t bytes_written = 0;  // payload bytes this rank wrote
  size_t items_written = 0;    // tensor chunks and objects this rank wrote
  bool direct_io = false;      // this rank's file was written with O_DIRECT
};

// Collective: every rank of `comm` calls it with its own sharded state dict.
// Factories are applied, non-persistent entries dropped, common (non-sharded)
// state saved once, by the coordinator (SaveOptions::coordinator_rank). Every stored shard is written exactly once, by
// one of the ranks that hold it (SaveOptions::writers). The sharding is
// validated across ranks before any byte is written. The checkpoint is
// committed (metadata.json written) only after every rank's data is durable;
// an error on any rank is raised on every rank and leaves `dir` untouched.
SaveReport save(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
                const SaveOptions& options = {});
// The same into any storage: `writer` (the same kind on every rank, at the
// same location) decides the format and where the bytes go; see
// distckpt/storage/storage_writer.h. SaveOptions::format is not consulted.
SaveReport save(const StateDict& sharded_state_dict, StorageWriter& writer, Communicator& comm,
                const SaveOptions& options = {});

// A dry run of save() in the distckpt format: the options and every rank's
// plan validated as save() validates them (the common-state comparison
// aside), and the index the checkpoint would have returned on every rank: keys,
// stored dtypes (SaveOptions::transform applied), global shapes, the chunks
// and the file (and writer rank) of each, byte lengths; offsets and checksums
// stay 0, as only writing decides them. Collective; touches no storage, and
// every rank builds the index itself (memory O(all chunks) on each).
StorageIndex dry_run_save(const StateDict& sharded_state_dict, Communicator& comm, const SaveOptions& options = {});

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

// Which tensors load_plain_tensors reads: those named in `keys` and those
// whose key starts with one of `prefixes`. A key not stored, or a prefix no
// stored key starts with, is a CheckpointError (a typo, not an empty result).
struct TensorSelection {
  std::vector<std::string> keys;
  std::vector<std::string> prefixes;
};
StateDict load_plain_tensors(const std::string& dir, const TensorSelection& selection);
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
  uint64_t hash;             // XXH3-64 of the logical tensor's row-major bytes
  std::string line() const;  // "KEY DTYPE [2,3] 0123456789abcdef"
};
// One digest per stored tensor, sorted by key. The hash covers the logical
// (unsharded) tensor, so the same state saved under any layout digests the
// same. Streams in bounded windows: memory stays O(window), not O(tensor).
std::vector<TensorDigest> digest_checkpoint(const std::string& dir);

}  // namespace distckpt
