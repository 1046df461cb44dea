// save(): every rank writes its shards of a sharded state dict, replicas
// once, and the checkpoint appears when all of them are durable.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/format/storage_index.h"
#include "distckpt/save/options.h"
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
// stay 0, as only writing decides them. Collective; touches no storage.
// Planned as save() plans; then every rank builds the index itself from
// every planner's records (memory O(all chunks) on each).
StorageIndex dry_run_save(const StateDict& sharded_state_dict, Communicator& comm, const SaveOptions& options = {});

}  // namespace distckpt
