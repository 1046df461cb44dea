// Least-loaded balancing, the one routine behind every "who does it" choice
// between ranks: the writer of a replicated shard (WriterPolicy::kBalanced),
// the reader of a shared piece (load_schedule.h) and the sender of a kept
// shard (local/shard_exchange.h).
//
// Items are taken largest first (stable: equal sizes keep their order), each
// to the candidate rank with the least load so far (ties to the lowest rank
// at or after `tie_start`, cyclically), whose load then grows by the item's
// bytes. Deterministic, so every rank
// computes the same choices from the same inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace distckpt::plan {

struct BalanceItem {
  uint64_t bytes = 0;
  std::vector<int> candidates;  // ranks that can take the item; not empty
};

struct Balance {
  std::vector<int> choice;     // per item, the chosen rank
  std::vector<uint64_t> load;  // per rank, initial load plus the bytes of its items
};

// `initial_load[r]`: rank r's load before these items (its size is the world).
Balance balance_least_loaded(const std::vector<BalanceItem>& items, std::vector<uint64_t> initial_load,
                             size_t tie_start = 0);

}  // namespace distckpt::plan
