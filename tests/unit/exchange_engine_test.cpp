// The exchange engine (comm/exchange.h) on its own, over real Gloo ranks:
// both modes, the rounds' bound on what each rank sends and receives,
// transfers to oneself, none at all, landing buffers, and a peer whose
// contribution does not match the plan.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(ExchangeEngine, RoundsDeliverEveryTransferOnce) {
  const auto transfers = mixed_transfers();
  for (uint64_t batch : {uint64_t{1}, uint64_t{40}, uint64_t{1} << 20}) {
    expect_all_delivered(transfers, run_exchange(transfers, ExchangeMode::kRounds, batch, false));
  }
}

// Forwards to a real communicator and keeps, for every all-to-all, the most
// bytes this rank sent to others and received from them.
class RoundMeter final : public Communicator {
 public:
  explicit RoundMeter(Communicator& inner) : inner_(inner) {}
  uint64_t most_sent = 0, most_received = 0, rounds = 0;
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::vector<std::string> all_to_all_bytes(const std::vector<std::string>& parts) override {
    std::vector<std::string> received = inner_.all_to_all_bytes(parts);
    uint64_t sent = 0, got = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      if (static_cast<int>(r) == rank()) continue;
      sent += parts[r].size();
      got += received[r].size();
    }
    most_sent = std::max(most_sent, sent);
    most_received = std::max(most_received, got);
    ++rounds;
    return received;
  }
  std::vector<std::string> all_gather_bytes(std::string_view local) override {
    ADD_FAILURE() << "the rounds all-gathered";
    return inner_.all_gather_bytes(local);
  }
  std::string broadcast_bytes(std::string_view data, int root) override { return inner_.broadcast_bytes(data, root); }
  std::vector<std::string> gather_bytes(std::string_view local, int root) override {
    return inner_.gather_bytes(local, root);
  }
  std::string scatter_bytes(const std::vector<std::string>& parts, int root) override {
    return inner_.scatter_bytes(parts, root);
  }
  void barrier() override { inner_.barrier(); }
  void broadcast_tensor(at::Tensor& tensor, int root) override { inner_.broadcast_tensor(tensor, root); }
  void send_tensor(const at::Tensor& tensor, int dst, int tag) override { inner_.send_tensor(tensor, dst, tag); }
  void recv_tensor(at::Tensor& tensor, int src, int tag) override { inner_.recv_tensor(tensor, src, tag); }
  std::string backend() const override { return inner_.backend(); }

 private:
  Communicator& inner_;
};

TEST(ExchangeEngine, ARankSendsAndReceivesAtMostTheBatchPerRound) {
  // Three ranks send rank 0 three 30-byte payloads each, rank 0 sends one of
  // 100 to rank 2 (larger than the batch) and rank 3 one to itself.
  std::vector<Transfer> transfers;
  for (int k = 0; k < 3; ++k) {
    for (int from = 1; from < 4; ++from) transfers.push_back({from, 0, 30});
  }
  transfers.push_back({0, 2, 100});
  transfers.push_back({3, 3, 50});
  constexpr uint64_t kBatch = 64;
  std::vector<std::map<size_t, std::string>> received(4);
  std::vector<uint64_t> sent_most(4), received_most(4), rounds(4);
  std::mutex mutex;
  run_ranks(
      4,
      [&](Communicator& inner) {
        RoundMeter c(inner);
        std::map<size_t, std::string> mine;
        std::string produced;
        comm::ExchangeCallbacks cb;
        cb.produce = [&](size_t k) {
          produced = payload_of(k, transfers[k].bytes);
          return comm::payload_view(produced.data(), produced.size());
        };
        cb.deliver = [&](size_t k, const at::Tensor& payload) {
          mine[k] = std::string(static_cast<const char*>(payload.data_ptr()), static_cast<size_t>(payload.numel()));
        };
        comm::exchange(c, transfers, cb, ExchangeMode::kRounds, kBatch);
        std::lock_guard<std::mutex> lock(mutex);
        const auto r = static_cast<size_t>(c.rank());
        received[r] = std::move(mine);
        sent_most[r] = c.most_sent;
        received_most[r] = c.most_received;
        rounds[r] = c.rounds;
      },
      kTimeout);
  expect_all_delivered(transfers, received);
  // Rank 0 takes two 30-byte payloads a round (nine in five rounds); the
  // 100-byte one is all that rank 0 sends and rank 2 receives in its round.
  EXPECT_EQ(received_most[0], 60u);
  EXPECT_EQ(sent_most[0], 100u);
  EXPECT_EQ(received_most[2], 100u);
  for (size_t r = 1; r < 4; ++r) {
    EXPECT_LE(sent_most[r], kBatch) << "rank " << r;
    if (r != 2) {
      EXPECT_EQ(received_most[r], 0u) << "rank " << r;
    }
  }
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(rounds[r], rounds[0]) << "every rank runs every round";
  EXPECT_EQ(rounds[0], 5u);
}

TEST(ExchangeEngine, TransfersToOneselfNeverLeaveTheRank) {
  const std::vector<Transfer> transfers = {{0, 0, 16}, {1, 1, 8}, {2, 2, 0}};
  for (auto mode : {ExchangeMode::kPointToPoint, ExchangeMode::kRounds}) {
    expect_all_delivered(transfers, run_exchange(transfers, mode, 4, false));
  }
}

TEST(ExchangeEngine, NoTransfersIsANoOp) {
  for (auto mode : {ExchangeMode::kPointToPoint, ExchangeMode::kRounds}) {
    const auto received = run_exchange({}, mode, 64, false);
    for (const auto& r : received) EXPECT_TRUE(r.empty());
  }
}

TEST(ExchangeEngine, ShortPeerContributionIsAProtocolError) {
  // Rank 1 plans a 4-byte transfer where rank 0 plans 8 (ranks of different
  // versions); a second transfer follows in the next round. Rank 0 reports
  // the first after running every round, so rank 1 is not left waiting.
  std::vector<std::string> errors(2);
  std::vector<std::vector<size_t>> delivered(2);
  run_ranks(
      2,
      [&](Communicator& c) {
        const auto me = static_cast<size_t>(c.rank());
        const std::vector<Transfer> transfers = {{1, 0, c.rank() == 1 ? 4u : 8u}, {1, 0, 8}};
        std::string produced;
        comm::ExchangeCallbacks cb;
        cb.produce = [&](size_t k) {
          produced = payload_of(k, transfers[k].bytes);
          return comm::payload_view(produced.data(), produced.size());
        };
        cb.deliver = [&](size_t k, const at::Tensor&) { delivered[me].push_back(k); };
        try {
          comm::exchange(c, transfers, cb, ExchangeMode::kRounds, 8);
        } catch (const ProtocolError& e) {
          errors[me] = e.what();
        }
      },
      kTimeout);
  EXPECT_NE(errors[0].find("exchange round 0: rank 1 sent 4 bytes, 8 planned"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(delivered[0], std::vector<size_t>{1});  // the second round's payload still arrived
}

}  // namespace
}  // namespace distckpt
