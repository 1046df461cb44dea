// Options of save and load: plain structs with defaults.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/core/state_dict.h"
#include "distckpt/format/name_mapping.h"
#include "distckpt/plan/writer_policy.h"
#include "distckpt/storage/storage_reader.h"
#include "distckpt/storage/storage_writer.h"

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

WriterPolicy parse_writer_policy(const std::string& name);  // "balanced", "lowest_rank", "main_replica"
const char* writer_policy_name(WriterPolicy policy);

class SavePlanCache;  // distckpt/api/plan_cache.h

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
  // What to write: distckpt's own format (kAuto means the same), or Hugging
  // Face safetensors straight from every rank (consolidated tensors, written
  // where they belong; options in `safetensors`; tensors and string common
  // values only). Asynchronous saves write distckpt's format.
  StorageFormat format = StorageFormat::kDistckpt;
  SafetensorsWriteOptions safetensors{};
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
  // Reuse planning (gathered plans, validation, writer choice, metadata
  // skeleton) while every rank's state dict keeps its structure. The same
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
  // The rank that gathers the plans, validates them, claims the directory,
  // writes the metadata and commits (DCP's coordinator_rank); its common
  // state and content_metadata are the ones saved. The same on every rank.
  int coordinator_rank = 0;
  SaveTransform transform{};
};

// How a stored piece that several ranks need reaches them.
enum class LoadExchange {
  // A piece several ranks need is read once: ranks on the reader's host
  // copy their parts out of shared memory (/dev/shm: per reading rank, four
  // times exchange_batch_bytes, or four slabs where one row is larger),
  // ranks on other hosts receive them as with kBroadcast. Without usable
  // shared memory, the ranks on a host each read their parts (a warning
  // says why).
  kAuto,
  kNone,  // every rank reads everything it needs itself
  // One rank (balanced by bytes) reads the piece, in bounded slabs, and sends
  // every other rank that needs part of it exactly that part, point to point.
  kBroadcast,
  // Same reads; the parts travel in batched rounds of one all-gather each
  // (fewer, larger collectives; every rank receives every batch).
  kAllGather,
};
LoadExchange parse_load_exchange(const std::string& name);  // "auto", "none", "broadcast", "all_gather"
const char* load_exchange_name(LoadExchange exchange);

struct LoadOptions {
  StrictHandling strict = StrictHandling::kAssumeOkUnexpected;
  // What the path holds; kAuto decides from its contents (detect_storage_format).
  StorageFormat format = StorageFormat::kAuto;
  // Verify the checksum of every block read (cheap: XXH3 runs at memory speed).
  bool verify_checksums = true;
  // A floating-point tensor may be requested in another floating-point dtype
  // than it is stored in (bf16 stored, fp32 wanted, and back): the values are
  // converted as they are copied. Off: any dtype difference is an error.
  bool convert_dtype = false;
  // Read a checkpoint in another naming (a Hugging Face directory) through
  // this mapping from the layout schema (gpt::llama_mapping(config)): the
  // request keeps its checkpoint keys. See map_storage.
  std::optional<NameMapping> mapping{};
  LoadExchange exchange = LoadExchange::kAuto;
  // Reader threads per rank for pieces read straight into their destination;
  // 0 = resolve_io_threads' share of this host's cores.
  int io_threads = 0;
  // Bytes of stored data in flight per reading rank: a slab of a piece read
  // for several ranks (one slot of its shared memory on one host holds one
  // batch of slabs), one all-gather round's contribution. 8 MiB: on this
  // project's benchmark host 32 MiB was no faster.
  uint64_t exchange_batch_bytes = uint64_t{8} << 20;
  // Megatron's validate_access_integrity on load (one gather of every rank's
  // request): the requested main replicas must tile each requested tensor
  // exactly once, as a save's would; ShardingError naming the tensor, ranks
  // and boxes otherwise. Off by default (Megatron's is on): a load may ask
  // for any part on any rank, overlapping or not.
  bool validate_access_integrity = false;
  // Pinned host memory a rank reads its CUDA destinations through, at most:
  // two windows (each the largest power of two within half of this), one
  // filled by reads while the other is copied to the device. A rank that
  // loads more onto its devices reads in rounds of one window each. The
  // memory stays in LibTorch's pinned-memory cache for the next load.
  uint64_t device_staging_bytes = uint64_t{2} << 30;
  // A load-side planner hook (DCP's LoadPlanner.commit_tensor), e.g. to
  // dequantize: a requested tensor stored in another dtype than requested is
  // read in its stored dtype (the requested local shape, on the CPU) and
  // handed to this function with its destination (the request's data, or a
  // new CPU tensor of the requested dtype), which the function fills. Unset:
  // convert_dtype decides whether such a request loads.
  std::function<void(const ShardedTensor& request, const at::Tensor& stored, at::Tensor& destination)> commit_tensor{};
};

// The I/O threads a rank uses for `requested` (SaveOptions/LoadOptions::io_threads):
// itself when positive; for 0, this host's cores divided among the ranks on it
// (LOCAL_WORLD_SIZE, as set by torchrun and distckpt-launch; 1 when unset),
// between 1 and kMaxAutoIoThreads. More threads than cores only make the
// copies and checksums of co-located ranks take turns. Negative: an error.
constexpr int kMaxAutoIoThreads = 4;
int resolve_io_threads(int requested);

}  // namespace distckpt
