// Options of save(): a plain struct with defaults, and the knobs' names.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/core/io_threads.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/format/name_mapping.h"
#include "distckpt/plan/writer_policy.h"
#include "distckpt/storage/storage_reader.h"
#include "distckpt/storage/storage_writer.h"

namespace distckpt {

WriterPolicy parse_writer_policy(const std::string& name);  // "balanced", "lowest_rank", "main_replica"
const char* writer_policy_name(WriterPolicy policy);

class SavePlanCache;  // distckpt/save/plan_cache.h

enum class CommonStateCheck { kWarn, kError };

// A save-side planner hook (PyTorch DCP's SavePlanner.resolve_data): store
// tensors in another form than they are held in, e.g. cast to bf16 or
// quantized to int8/float8. Both functions are optional.
struct SaveTransform {
  // The dtype a tensor is stored in (unset: the dtype it is held in). Called
  // while planning, on every rank holding a part of it; the ranks must agree,
  // as for any dtype, since the metadata records one dtype per tensor.
  std::function<at::ScalarType(const ShardedTensor& tensor)> stored_dtype;
  // The values written for a shard this rank writes (only those: replicas
  // written by another rank are not transformed), from its local data: the
  // stored dtype, the same number of elements. Unset: a cast to the stored dtype.
  std::function<at::Tensor(const ShardedTensor& tensor, const at::Tensor& data)> resolve_data;
};

struct SaveOptions {
  // What to write: distckpt's own format, or another registered format that
  // saves write, with its knobs: Hugging Face safetensors straight from every
  // rank with safetensors_format(SafetensorsWriteOptions{...})
  // (distckpt/storage/safetensors.h: consolidated tensors, written where they
  // belong; tensors and string common values only). Asynchronous and
  // streamed saves write distckpt's format.
  StorageFormat format = StorageFormat::distckpt();
  // Replace a committed checkpoint in the target directory. The old one is
  // removed only after the new one is committed, so a failed save loses nothing.
  // (distckpt format; a safetensors save never replaces a directory.)
  bool overwrite = false;
  // Checksum granularity: loads verify every block they read.
  uint64_t checksum_block_size = uint64_t{1} << 20;
  WriterPolicy writers = WriterPolicy::kBalanced;
  // Writer threads per rank (each copies, checksums and writes its slices);
  // 0 = resolve_io_threads' share of this host's cores.
  int io_threads = 0;
  // Write with O_DIRECT where the file system allows it (falls back to
  // buffered writes, e.g. on tmpfs). Data is fsync'ed either way.
  bool direct_io = true;
  // Reuse planning (validation, writer choice, metadata skeleton) while every
  // rank's state dict keeps its structure. The same
  // cache object must be passed on every rank; null = plan every save.
  std::shared_ptr<SavePlanCache> plan_cache{};
  // Recorded in the metadata (the generated API fills these).
  std::string layout_name{};
  std::string layout_fingerprint{};
  std::string layout_schema{};
  // The schema's name mappings under this config (metadata; `distckpt
  // convert --map` exports under them).
  std::vector<NameMapping> name_mappings{};
  // A small dict describing the content (Megatron's content_metadata, e.g.
  // the distributed optimizer's sharding type), stored with the common state
  // and read back alone by load_content_metadata. Plain values only (dicts,
  // lists, None/bool/int/float/string); taken from the coordinator.
  // distckpt format only.
  std::optional<StateDict> content_metadata{};
  // What to do when the common (non-sharded) state differs between ranks:
  // the coordinator's is saved either way. kWarn logs on every differing rank the key
  // paths that differ; kError refuses the save, naming them.
  CommonStateCheck common_state_check = CommonStateCheck::kWarn;
  // Megatron's validate_access_integrity: the main replicas must cover every
  // tensor exactly once and every object shard must be saved once. Off skips
  // that check (dtype and shape agreement stay): planning at huge scale gets
  // cheaper, and a wrong sharding then makes a checkpoint a load refuses.
  bool validate_access_integrity = true;
  // The rank that claims the directory, assembles and writes the metadata
  // and commits (DCP's coordinator_rank); its common
  // state and content_metadata are the ones saved. The same on every rank.
  int coordinator_rank = 0;
  SaveTransform transform{};
};

}  // namespace distckpt
