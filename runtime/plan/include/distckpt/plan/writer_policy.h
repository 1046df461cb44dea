// Which rank writes a shard that several ranks hold. Owned by the planner,
// which applies it; chosen through SaveOptions::writers.
#pragma once

namespace distckpt {

// Which rank writes a tensor shard that several ranks hold (replicas over
// dp, ...). A sharded object is always written by its main replica, whose
// contents may differ from the others' (per-rank RNG state), as in Megatron.
enum class WriterPolicy {
  // Fully parallel: one of the holders, chosen so the ranks that hold the
  // same shards (the data-parallel replicas of a chunk, typically) write
  // about the same bytes between them, as Megatron balances within its
  // parallelization group. Deterministic: largest shards first, to the holder
  // with the fewest of that set's bytes so far; ties go round the set from a
  // point its hash picks. Shards only one rank holds are written by it.
  kBalanced,
  kLowestRank,   // the lowest rank that holds it
  kMainReplica,  // the holder whose replica id is all zeros (Megatron without fully parallel)
};

}  // namespace distckpt
