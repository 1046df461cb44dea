#include "plan/balance.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "distckpt/core/errors.h"

namespace distckpt::plan {

Balance balance_least_loaded(const std::vector<BalanceItem>& items, std::vector<uint64_t> initial_load,
                             size_t tie_start) {
  Balance out{std::vector<int>(items.size(), -1), std::move(initial_load)};
  const size_t world = out.load.size();
  const auto tie_rank = [&](int r) { return (static_cast<size_t>(r) + world - tie_start % world) % world; };
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].bytes > items[b].bytes; });
  for (size_t i : order) {
    int best = -1;
    for (int r : items[i].candidates) {
      if (r < 0 || static_cast<size_t>(r) >= out.load.size()) {
        throw UsageError(fmt::format("balance: item {} names rank {} of {}", i, r, out.load.size()));
      }
      const uint64_t load = out.load[static_cast<size_t>(r)];
      if (best < 0 || load < out.load[static_cast<size_t>(best)] ||
          (load == out.load[static_cast<size_t>(best)] && tie_rank(r) < tie_rank(best))) {
        best = r;
      }
    }
    if (best < 0) throw UsageError(fmt::format("balance: item {} has no candidate rank", i));
    out.choice[i] = best;
    out.load[static_cast<size_t>(best)] += items[i].bytes;
  }
  return out;
}

}  // namespace distckpt::plan
