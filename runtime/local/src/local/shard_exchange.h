// Fully parallel tensor-aware state dicts: a replicated shard is kept by one
// of its holders; in to_state_dict the others receive it over the
// communicator, through the comm layer's exchange engine (comm/exchange.h).
// Point to point (partitioned): every rank routes the identities of the
// shards it needs and keeps to the scheduler of each identity (a hash,
// modulo the world; one all-to-all); a scheduler picks a keeper for each
// need (plan/balance.h, within its identities) and tells each rank its
// transfers with their windows (one all-to-all); the ranks agree that the
// answers made sense, so no rank holds the world's needs. Batched rounds (kAllGather) cut the rounds over every
// transfer: every rank gathers every rank's needs, then the offers of those
// it keeps (two all-gathers), and derives the same transfer list.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "comm/exchange.h"
#include "distckpt/api/options.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/core/sharded_tensor.h"

namespace distckpt::local {

// A shard's identity across ranks: key, position and flat range.
std::string shard_identity(const ShardedTensor& meta);

struct KeptShard {
  std::string identity;
  at::Tensor data;  // this rank's copy, any device
};

struct NeededShard {
  std::string identity;
  std::string description;  // for messages (ShardedTensor::describe)
  at::Tensor dest;          // filled by the exchange
};

// The steps of the partitioned exchange, each a pure function of the
// messages of the step before (exchange_kept_shards moves them).
//
// route: part s for scheduler s; `routed_kept[s]`: the kept shards (indices
// into `kept`) routed to s, in order.
std::vector<std::string> route_shards(const std::vector<KeptShard>& kept, const std::vector<NeededShard>& needed,
                                      int world, std::map<int, std::vector<size_t>>& routed_kept);
// schedule, on what every rank routed to rank `me` (by rank): each rank's
// transfers, part r for rank r. Throws ShardingError when a shard some rank
// needs is kept by no rank.
std::vector<std::string> schedule_shard_transfers(const std::vector<std::string>& routed, int me, uint64_t batch_bytes);
// merge, on a rank: its transfers from every scheduler's answer (by rank),
// in (window, tag) order, checked against what it routed and needs
// (ProtocolError).
struct ShardMove {
  comm::KeyedTransfer keyed;
  size_t kept = 0;    // what it sends: an index into `kept`
  uint32_t need = 0;  // what it receives: an index into `needed`
};
std::vector<ShardMove> merge_shard_transfers(const std::vector<std::string>& answers, int me,
                                             const std::vector<KeptShard>& kept, const std::vector<NeededShard>& needed,
                                             const std::map<int, std::vector<size_t>>& routed_kept);

// Collective. Throws ShardingError (on every rank, identically) when a shard
// some rank needs is kept by no rank; communication failures throw CommError.
void exchange_kept_shards(const std::vector<KeptShard>& kept, std::vector<NeededShard>& needed, Communicator& comm,
                          LoadExchange mode, uint64_t batch_bytes);

}  // namespace distckpt::local
