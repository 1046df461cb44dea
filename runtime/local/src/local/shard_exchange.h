// Fully parallel tensor-aware state dicts: a replicated shard is kept by one
// of its holders; in to_state_dict the others receive it over the
// communicator. Every rank announces the shards it needs, then those it keeps
// that someone needs (two all-gathers); every rank derives the same transfer
// list from that (each need sent by a keeper picked by plan/balance.h) and
// the comm layer's exchange engine (comm/exchange.h) runs it.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

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

// Collective. Throws ShardingError (on every rank, identically) when a shard
// some rank needs is kept by no rank; communication failures throw CommError.
void exchange_kept_shards(const std::vector<KeptShard>& kept, std::vector<NeededShard>& needed, Communicator& comm,
                          LoadExchange mode, uint64_t batch_bytes);

}  // namespace distckpt::local
