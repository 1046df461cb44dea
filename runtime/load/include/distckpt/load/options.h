// Options of load(): a plain struct with defaults, and the knobs' names.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "distckpt/core/io_threads.h"
#include "distckpt/core/sharded_tensor.h"
#include "distckpt/format/name_mapping.h"
#include "distckpt/storage/storage_reader.h"

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
  // Planned partitioned (kAuto too): no rank holds every rank's needs.
  kBroadcast,
  // Same reads; the parts travel in batched rounds (Megatron's
  // gather_rounds), one all-to-all each: fewer, larger collectives, and in a
  // round a rank sends and receives at most exchange_batch_bytes of its own.
  // The rounds are cut over every rank's transfers, so every rank gathers
  // every rank's needs and plans the whole load, and every rank must pass
  // the same exchange_batch_bytes (UsageError on every rank otherwise).
  kAllGather,
};
LoadExchange parse_load_exchange(const std::string& name);  // "auto", "none", "broadcast", "all_gather"
const char* load_exchange_name(LoadExchange exchange);

struct LoadOptions {
  StrictHandling strict = StrictHandling::kAssumeOkUnexpected;
  // What the path holds; kAuto decides from its contents (detect_storage_format).
  StorageFormat format = StorageFormat::detected();
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

}  // namespace distckpt
