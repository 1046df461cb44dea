// transfer(): a sharded state moved from the ranks that hold it (the
// sources, in one layout) to the ranks that ask for it (the destinations,
// in any layout), without storage: the weights of a trainer into inference
// ranks after a step, or a job's state into its new mesh when it shrinks or
// grows. It is a load whose checkpoint is the sources' memory: the same
// planner decides who sends which bytes (each piece by one of the ranks
// that hold it, spread by bytes), the same exchange engine moves them point
// to point in bounded buckets, and factories, flat (ZeRO) ranges, stacked
// layers and dtype conversion work as in a load. Then every tensor's
// layout-independent digest (the one `distckpt digest` prints) is compared
// between what the sources hold and what the destinations received.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/format/name_mapping.h"
#include "distckpt/load/options.h"

namespace distckpt {

// Reusing a transfer's plan while the sources and the requests keep their
// structure (the weights sent after every training step): the sources'
// layout, who sends which piece and the windows the bytes travel in are
// planned once; a repeated transfer plans only its own reads again, and
// the agreement its reads begin with (a collective they need anyway) also
// checks, with 8 bytes per rank, that every rank's sources (where they lie
// too, with direct reads), requests and options are what was planned. Then
// it only moves the bytes (and compares digests). Any change on any rank
// plans again and refreshes the cache. Each rank keeps its own cache
// object; a rank that passes none makes every rank plan.
class TransferPlanCache {
 public:
  static std::shared_ptr<TransferPlanCache> create();
  ~TransferPlanCache();
  TransferPlanCache(const TransferPlanCache&) = delete;
  TransferPlanCache& operator=(const TransferPlanCache&) = delete;

  uint64_t plans_made() const;    // transfers that planned from scratch
  uint64_t plans_reused() const;  // transfers that replayed the cached plan
  void invalidate();              // the next transfer plans from scratch

 private:
  struct State;                           // defined by the runtime
  friend struct TransferPlanCacheAccess;  // the runtime's transfer
  TransferPlanCache();
  std::unique_ptr<State> state_;
};

struct TransferOptions {
  // Bytes in flight per rank: a slab a sender copies out of its tensor and
  // the message it packs from it (the load's exchange_batch_bytes).
  uint64_t bucket_bytes = uint64_t{64} << 20;
  // A floating-point destination may have another floating-point dtype than
  // its source (converted as it arrives). Such tensors are not digested.
  bool convert_dtype = false;
  // Compare every tensor's digest between sources and destinations (costs a
  // pass over the bytes on both sides; see docs/PERFORMANCE.md).
  bool verify = true;
  // As a load's (LoadExchange): kBroadcast sends every part as a message
  // (point to point, at most bucket_bytes in flight per rank); kAuto, within
  // a host, reads parts straight out of the sender's memory (direct_reads)
  // or, where that cannot be, hands them over through shared memory (each
  // sender maps four buckets there and its receivers map them too: see
  // docs/PERFORMANCE.md; it fails where /dev/shm cannot hold them), and
  // sends messages between hosts; kAllGather sends in rounds. kNone cannot
  // serve a transfer.
  LoadExchange exchange = LoadExchange::kBroadcast;
  // With kAuto: a rank reads the CPU sources of the other ranks of its host
  // straight out of their memory (Linux cross-memory attach,
  // process_vm_readv): each byte copied once, into its destination, no
  // buffer in between. For the transfer's duration every rank allows
  // processes of its user to ptrace it, which such reads need
  // (prctl(PR_SET_PTRACER, ANY), for Yama's ptrace scope 1; cleared after,
  // a ptracer set before is not restored); where a host's ranks cannot read
  // one another (checked first: containers, ptrace scope 2, seccomp),
  // shared memory serves that host instead. Sources on a GPU, not
  // contiguous, or not in the storage of a tensor the caller passed (what a
  // factory builds anew) go through shared memory too. false: shared memory
  // only.
  bool direct_reads = true;
  // Threads per rank copying the pieces a rank keeps from its own sources;
  // 0 = resolve_io_threads' share of the host's cores.
  int io_threads = 0;
  // Requests named in another naming, through this mapping from the layout
  // schema (gpt::llama_mapping(config)): an entry keyed by an external name
  // (a Hugging Face tensor) receives its part of the source tensor the
  // mapping puts it in (a layer of a stack, a fused part), in any box.
  std::optional<NameMapping> mapping{};
  // Plan once, replay while nothing changes (see TransferPlanCache).
  std::shared_ptr<TransferPlanCache> plan_cache{};
};

struct TransferResult {
  StateDict state_dict;  // the request with its tensors filled (factories merged)
  // Bytes this rank copied out of source tensors (its own, for others or
  // itself, and other ranks' it read directly).
  uint64_t source_bytes_read = 0;
  // Of those, bytes read straight out of another rank's memory (direct_reads).
  uint64_t bytes_read_directly = 0;
  // The tensors this rank checked (it owns their comparison): digest equal
  // on the sources and the destinations.
  std::map<std::string, uint64_t> verified;
  // The tensors this rank owns that were not compared, and why (received in
  // another dtype; not received whole by the destinations' main replicas).
  std::map<std::string, std::string> unverified;
  bool plan_reused = false;  // the cached plan was replayed
  // Seconds on this rank: planning (until bytes began to move), moving them
  // (packing, sending, unpacking, until every rank agreed they arrived),
  // comparing digests.
  double planning_seconds = 0, moving_seconds = 0, verifying_seconds = 0;
};

// Collective over every rank of `comm`: the source ranks, the destination
// ranks, or both. A transfer moves ShardedTensors (and factories); objects
// and plain values stay where they are (the result keeps the request's).
// `sources`: this rank's sharded state (ShardedTensors with data; an empty
// dict on a rank that sends nothing); every tensor's main
// replicas must tile it across the ranks (ShardingError otherwise), and
// its copies (replica ids not all zero) share the sending. `requests`: what
// this rank wants, in any layout (ShardedTensors, filled in place when
// they carry data, else allocated). A request for a tensor no rank sends
// is a KeyMismatchError on every rank; a failed rank, a timeout or a
// digest that differs fails every rank with the same error class.
TransferResult transfer(const StateDict& sources, const StateDict& requests, Communicator& comm,
                        const TransferOptions& options = {});

}  // namespace distckpt
