// The exchange engine (comm/exchange.h) on its own, over real Gloo ranks:
// both modes, transfers to oneself, none at all, landing buffers, and a peer
// whose contribution does not match the plan.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/exchange.h"
#include "distckpt/core/errors.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using comm::ExchangeMode;
using comm::Transfer;

constexpr auto kTimeout = std::chrono::seconds(30);

// Transfer k's payload: bytes that depend on k and the position.
std::string payload_of(size_t k, uint64_t bytes) {
  std::string s(bytes, '\0');
  for (uint64_t i = 0; i < bytes; ++i) s[i] = static_cast<char>((k * 13 + i * 7) % 251);
  return s;
}

// A mix over 3 ranks: several per pair, to oneself, empty, and one larger
// than a round.
std::vector<Transfer> mixed_transfers() {
  return {{0, 1, 10}, {1, 0, 5}, {2, 2, 7},  {0, 2, 0},  {2, 1, 300}, {1, 2, 33},
          {0, 0, 4},  {2, 0, 1}, {0, 1, 64}, {1, 0, 12}, {2, 1, 3}};
}

// Runs the exchange on every rank; returns what each rank received, by transfer.
std::vector<std::map<size_t, std::string>> run_exchange(const std::vector<Transfer>& transfers, ExchangeMode mode,
                                                        uint64_t batch_bytes, bool landing) {
  std::vector<std::map<size_t, std::string>> received(3);
  std::mutex mutex;
  run_ranks(
      3,
      [&](Communicator& c) {
        std::map<size_t, std::string> mine;
        std::map<size_t, at::Tensor> landed;
        std::string produced;
        comm::ExchangeCallbacks cb;
        cb.produce = [&](size_t k) {
          EXPECT_EQ(transfers[k].from, c.rank());
          produced = payload_of(k, transfers[k].bytes);
          return comm::payload_view(produced.data(), produced.size());
        };
        if (landing) {
          cb.landing = [&](size_t k) {
            return landed[k] = at::empty({static_cast<int64_t>(transfers[k].bytes)}, at::kByte);
          };
        }
        cb.deliver = [&](size_t k, const at::Tensor& payload) {
          EXPECT_EQ(transfers[k].to, c.rank());
          EXPECT_FALSE(mine.count(k)) << "transfer " << k << " delivered twice";
          const at::Tensor host = payload.cpu().contiguous();
          mine[k] = std::string(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(host.numel()));
        };
        comm::exchange(c, transfers, cb, mode, batch_bytes);
        for (auto& [k, t] : landed) mine[k] = std::string(static_cast<const char*>(t.data_ptr()), t.numel());
        std::lock_guard<std::mutex> lock(mutex);
        received[static_cast<size_t>(c.rank())] = std::move(mine);
      },
      kTimeout);
  return received;
}

void expect_all_delivered(const std::vector<Transfer>& transfers,
                          const std::vector<std::map<size_t, std::string>>& received) {
  for (size_t k = 0; k < transfers.size(); ++k) {
    const auto& at = received[static_cast<size_t>(transfers[k].to)];
    ASSERT_TRUE(at.count(k)) << "transfer " << k << " never arrived";
    EXPECT_EQ(at.at(k), payload_of(k, transfers[k].bytes)) << "transfer " << k;
  }
  size_t total = 0;
  for (const auto& r : received) total += r.size();
  EXPECT_EQ(total, transfers.size());
}

TEST(ExchangeEngine, PointToPointDeliversEveryTransferOnce) {
  const auto transfers = mixed_transfers();
  expect_all_delivered(transfers, run_exchange(transfers, ExchangeMode::kPointToPoint, 0, false));
}

TEST(ExchangeEngine, PointToPointReceivesIntoLandingBuffers) {
  const auto transfers = mixed_transfers();
  expect_all_delivered(transfers, run_exchange(transfers, ExchangeMode::kPointToPoint, 0, true));
}

TEST(ExchangeEngine, AllGatherInRoundsOfBoundedBytes) {
  const auto transfers = mixed_transfers();
  for (uint64_t batch : {uint64_t{1}, uint64_t{40}, uint64_t{1} << 20}) {
    expect_all_delivered(transfers, run_exchange(transfers, ExchangeMode::kAllGather, batch, false));
  }
}

TEST(ExchangeEngine, TransfersToOneselfNeverLeaveTheRank) {
  const std::vector<Transfer> transfers = {{0, 0, 16}, {1, 1, 8}, {2, 2, 0}};
  for (auto mode : {ExchangeMode::kPointToPoint, ExchangeMode::kAllGather}) {
    expect_all_delivered(transfers, run_exchange(transfers, mode, 4, false));
  }
}

TEST(ExchangeEngine, NoTransfersIsANoOp) {
  for (auto mode : {ExchangeMode::kPointToPoint, ExchangeMode::kAllGather}) {
    const auto received = run_exchange({}, mode, 64, false);
    for (const auto& r : received) EXPECT_TRUE(r.empty());
  }
}

TEST(ExchangeEngine, ShortPeerContributionIsAProtocolError) {
  // Rank 1 plans a 4-byte transfer where rank 0 plans 8 (ranks of different versions).
  EXPECT_TRUE(throws_with<ProtocolError>(
      [&] {
        run_ranks(
            2,
            [&](Communicator& c) {
              const std::vector<Transfer> transfers = {{1, 0, c.rank() == 1 ? 4u : 8u}};
              std::string produced;
              comm::ExchangeCallbacks cb;
              cb.produce = [&](size_t k) {
                produced = payload_of(k, transfers[k].bytes);
                return comm::payload_view(produced.data(), produced.size());
              };
              cb.deliver = [](size_t, const at::Tensor&) {};
              comm::exchange(c, transfers, cb, ExchangeMode::kAllGather, 1024);
            },
            kTimeout);
      },
      "rank 1 sent 4 bytes, 8 planned"));
}

}  // namespace
}  // namespace distckpt
