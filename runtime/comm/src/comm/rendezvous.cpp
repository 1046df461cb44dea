// Arrival at start-up: a counter every rank increments, a key the last one
// sets, and one key per rank that only a failed wait reads.
#include "comm/rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

constexpr const char* kCount = "distckpt/arrival/count";
constexpr const char* kEveryone = "distckpt/arrival/everyone";
constexpr const char* kMissing = "distckpt/arrival/missing";

std::string rank_key(int rank) { return fmt::format("distckpt/arrival/rank/{}", rank); }

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

double seconds(std::chrono::milliseconds t) { return static_cast<double>(t.count()) / 1000.0; }

// "3, 5-9": runs of consecutive ranks collapsed, the list bounded.
std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t kMaxRuns = 32;
  std::string text;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (runs == kMaxRuns) {
      text += fmt::format(", ... ({} ranks in all)", ranks.size());
      break;
    }
    text += (runs > 0 ? ", " : "") + (i == j ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    ++runs;
    i = j + 1;
  }
  return text;
}

// Rank 0 (whose store the others reach, so it is there) finds who is missing.
std::string missing_ranks(c10d::Store& store, int world_size) {
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    if (!store.check({rank_key(r)})) missing.push_back(r);
  }
  return rank_list(missing);
}

}  // namespace

void wait_for_every_rank(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                         std::chrono::milliseconds timeout) {
  if (world_size == 1) return;
  store->set(rank_key(rank), bytes_of("1"));
  if (store->add(kCount, 1) == world_size) store->set(kEveryone, bytes_of("1"));
  try {
    store->wait({kEveryone}, timeout);
    return;
  } catch (const std::exception&) {
    // Below: say who is missing.
  }
  const int64_t arrived = std::min<int64_t>(store->add(kCount, 0), world_size);
  std::string missing;
  if (rank == 0) {
    missing = missing_ranks(*store, world_size);
    store->set(kMissing, bytes_of(missing));
  } else {
    // Rank 0 started its wait no later than this rank could reach it.
    const auto grace = std::min(timeout, std::chrono::milliseconds(10000));
    try {
      store->wait({kMissing}, grace);
      const std::vector<uint8_t> got = store->get(kMissing);
      missing.assign(got.begin(), got.end());
    } catch (const std::exception&) {
      missing = "unknown (rank 0 did not list them)";
    }
  }
  throw TimeoutError(fmt::format(
      "rank {} of {}: only {} of {} ranks started within the timeout of {:g} s; rank(s) {} never arrived. Check that "
      "they were launched and are not stuck before creating the communicator; if they are only slow to start, raise "
      "the timeout (DISTCKPT_TIMEOUT_SECONDS or ProcessGroupOptions::timeout)",
      rank, world_size, arrived, world_size, seconds(timeout), missing));
}

}  // namespace distckpt
