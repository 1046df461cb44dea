// Which rank writes a shard that several ranks hold. Owned by the planner,
// which applies it; chosen through SaveOptions::writers.
#pragma once

namespace distckpt {

// Which rank writes a shard that several ranks hold (replicas over dp, ...).
enum class WriterPolicy {
  // Fully parallel: one of the holders, chosen so every rank writes about the
  // same bytes (deterministic: largest shards first, to the least-loaded
  // holder, ties to the lowest rank).
  kBalanced,
  kLowestRank,   // the lowest rank that holds it
  kMainReplica,  // the holder whose replica id is all zeros (Megatron without fully parallel)
};

}  // namespace distckpt
