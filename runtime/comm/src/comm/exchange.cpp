#include "comm/exchange.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt::comm {
namespace {

void check_payload(const at::Tensor& payload, const Transfer& t, size_t k) {
  if (!payload.defined() || payload.scalar_type() != at::kByte || payload.dim() != 1 ||
      static_cast<uint64_t>(payload.numel()) != t.bytes) {
    throw Error(fmt::format("exchange: transfer {} produced {} bytes, {} planned", k,
                            payload.defined() ? payload.numel() : 0, t.bytes));
  }
}

at::Tensor produce_checked(const ExchangeCallbacks& cb, const std::vector<Transfer>& transfers, size_t k) {
  at::Tensor payload = cb.produce(k);
  check_payload(payload, transfers[k], k);
  return payload;
}

// The transfers in windows of at most batch_bytes moved (a larger transfer
// has a window alone), each posted as one batch: one NCCL group, or Gloo's
// asynchronous sends and receives. Every rank cuts the same windows.
void run_point_to_point(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& cb,
                        uint64_t batch_bytes) {
  const int me = comm.rank();
  const at::Device device = comm.tensor_device();
  const auto tag_of = [](size_t k) { return static_cast<int>(k & 0x3fffffff); };
  for (size_t a = 0; a < transfers.size();) {
    size_t b = a;
    uint64_t moved = 0;
    for (; b < transfers.size(); ++b) {
      const uint64_t bytes = transfers[b].from == transfers[b].to ? 0 : transfers[b].bytes;
      if (b > a && moved + bytes > batch_bytes) break;
      moved += bytes;
    }
    // produce may reuse its buffer at the next call: a payload still to be
    // sent when produce is called again is copied first.
    size_t last_produce = b;
    for (size_t k = a; k < b; ++k) {
      if (transfers[k].from == me) last_produce = k;
    }
    std::vector<PeerTensor> sends, recvs;
    std::vector<std::pair<size_t, size_t>> delivered;  // (transfer, its receive) received outside a landing
    for (size_t k = a; k < b; ++k) {
      const Transfer& t = transfers[k];
      if (t.from == me && t.to == me) {
        cb.deliver(k, cb.produce(k));
      } else if (t.from == me) {
        const at::Tensor payload = produce_checked(cb, transfers, k);
        if (t.bytes == 0) continue;  // no message for an empty payload: both ends know it is empty
        at::Tensor wire = payload.to(device).contiguous();
        if (k != last_produce && wire.data_ptr() == payload.data_ptr()) wire = wire.clone();
        sends.push_back(PeerTensor{std::move(wire), t.to, tag_of(k)});
      } else if (t.to == me && t.bytes > 0) {
        at::Tensor landing = cb.landing ? cb.landing(k) : at::Tensor();
        if (!landing.defined()) {
          landing = at::empty({static_cast<int64_t>(t.bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
          delivered.emplace_back(k, recvs.size());
        }
        recvs.push_back(PeerTensor{std::move(landing), t.from, tag_of(k)});
      } else if (t.to == me) {
        cb.deliver(k, at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device)));
      }
    }
    comm.exchange_tensors(sends, recvs);
    for (const auto& [k, r] : delivered) cb.deliver(k, recvs[r].tensor);
    a = b;
  }
}

// The round of every transfer, cut in global order so that no rank sends
// more than batch_bytes in a round, nor receives more (a larger transfer is
// all that its sender sends and its receiver receives in its round). A
// transfer goes in the first round at or after its sender's and its
// receiver's latest where both still have room, so the transfers of one pair
// keep their order. Every rank computes the same.
struct Rounds {
  std::vector<uint32_t> of_transfer;
  uint32_t count = 0;
};

Rounds cut_rounds(const std::vector<Transfer>& transfers, size_t world, uint64_t batch_bytes) {
  struct Cursor {
    uint32_t round = 0;
    uint64_t used = 0;
  };
  std::vector<Cursor> sending(world), receiving(world);
  Rounds rounds;
  rounds.of_transfer.resize(transfers.size());
  for (size_t k = 0; k < transfers.size(); ++k) {
    const Transfer& t = transfers[k];
    if (t.from < 0 || static_cast<size_t>(t.from) >= world || t.to < 0 || static_cast<size_t>(t.to) >= world) {
      throw Error(
          fmt::format("exchange: transfer {} is from rank {} to rank {} in a world of {}", k, t.from, t.to, world));
    }
    Cursor& out = sending[static_cast<size_t>(t.from)];
    Cursor& in = receiving[static_cast<size_t>(t.to)];
    const uint64_t bytes = t.from == t.to ? 0 : t.bytes;  // to oneself: nothing moves
    uint32_t round = std::max(out.round, in.round);
    const auto used = [&round](const Cursor& c) { return c.round == round ? c.used : 0; };
    const auto full = [&](const Cursor& c) { return used(c) > 0 && used(c) + bytes > batch_bytes; };
    if (full(out) || full(in)) ++round;
    out = Cursor{round, used(out) + bytes};
    if (t.from != t.to) in = Cursor{round, used(in) + bytes};
    rounds.of_transfer[k] = round;
    rounds.count = std::max(rounds.count, round + 1);
  }
  return rounds;
}

// Rounds of one all-to-all each: a rank sends every peer, in one part, the
// payloads of its transfers to that peer in the round, in transfer order.
void run_rounds(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& cb,
                uint64_t batch_bytes) {
  const int me = comm.rank();
  const size_t world = static_cast<size_t>(comm.size());
  const Rounds rounds = cut_rounds(transfers, world, batch_bytes);
  // This rank's transfers by round (sent or received), in transfer order.
  std::vector<std::vector<size_t>> mine(rounds.count);
  for (size_t k = 0; k < transfers.size(); ++k) {
    if (transfers[k].from == me || transfers[k].to == me) mine[rounds.of_transfer[k]].push_back(k);
  }
  std::vector<std::string> parts(world);
  std::map<int, uint64_t> planned;  // bytes expected from each sender this round
  // A peer that sent other bytes than planned is reported after the last
  // round: every rank runs every round's collective, so none is left waiting.
  std::exception_ptr mismatch;
  for (uint32_t round = 0; round < rounds.count; ++round) {
    for (std::string& part : parts) part.clear();
    planned.clear();
    for (const size_t k : mine[round]) {
      const Transfer& t = transfers[k];
      if (t.from == me && t.to == me) {
        cb.deliver(k, cb.produce(k));
      } else if (t.from == me) {
        const at::Tensor payload = produce_checked(cb, transfers, k).cpu().contiguous();
        parts[static_cast<size_t>(t.to)].append(static_cast<const char*>(payload.data_ptr()), t.bytes);
      } else {
        planned[t.from] += t.bytes;
      }
    }
    const std::vector<std::string> received = comm.all_to_all_bytes(parts);
    std::vector<bool> matches(world, true);
    for (size_t from = 0; from < world; ++from) {
      const auto expected = planned.find(static_cast<int>(from));
      const uint64_t bytes = expected == planned.end() ? 0 : expected->second;
      if (static_cast<int>(from) != me && received[from].size() != bytes) {
        matches[from] = false;
        if (!mismatch) {
          mismatch = std::make_exception_ptr(ProtocolError(fmt::format(
              "exchange round {}: rank {} sent {} bytes, {} planned", round, from, received[from].size(), bytes)));
        }
      }
    }
    std::map<int, uint64_t> at;  // read position in each sender's part
    for (const size_t k : mine[round]) {
      const Transfer& t = transfers[k];
      if (t.to != me || t.from == me || !matches[static_cast<size_t>(t.from)]) continue;
      uint64_t& offset = at[t.from];
      cb.deliver(k, payload_view(received[static_cast<size_t>(t.from)].data() + offset, t.bytes));
      offset += t.bytes;
    }
  }
  if (mismatch) std::rethrow_exception(mismatch);
}
}  // namespace

at::Tensor payload_view(const void* data, uint64_t bytes) {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
}

void exchange(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& callbacks,
              ExchangeMode mode, uint64_t batch_bytes) {
  if (mode == ExchangeMode::kRounds) {
    run_rounds(comm, transfers, callbacks, batch_bytes);
  } else {
    run_point_to_point(comm, transfers, callbacks, batch_bytes);
  }
}

}  // namespace distckpt::comm
