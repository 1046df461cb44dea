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

PayloadTamper& tamper() {
  static PayloadTamper hook;
  return hook;
}

// A payload for another rank.
at::Tensor produce_checked(const ExchangeCallbacks& cb, const std::vector<KeyedTransfer>& mine, size_t k) {
  at::Tensor payload = cb.produce(k);
  check_payload(payload, mine[k].transfer, k);
  if (tamper()) tamper()(mine[k].transfer, payload);
  return payload;
}

void check_order(const std::vector<KeyedTransfer>& mine, int me) {
  for (size_t k = 0; k < mine.size(); ++k) {
    const Transfer& t = mine[k].transfer;
    if (t.from != me && t.to != me) {
      throw Error(fmt::format("exchange: rank {} was given transfer {} from rank {} to rank {}", me, k, t.from, t.to));
    }
    if (k > 0 && std::make_pair(mine[k].window, mine[k].tag) < std::make_pair(mine[k - 1].window, mine[k - 1].tag)) {
      throw Error(fmt::format("exchange: transfer {} is out of (window, tag) order", k));
    }
  }
}

// Window by window, each posted as one batch: one NCCL group, or Gloo's
// asynchronous sends and receives.
void run_point_to_point(Communicator& comm, const std::vector<KeyedTransfer>& mine, const ExchangeCallbacks& cb) {
  const int me = comm.rank();
  const at::Device device = comm.tensor_device();
  const auto tag_of = [](uint32_t tag) { return static_cast<int>(tag & 0x3fffffff); };
  for (size_t a = 0; a < mine.size();) {
    size_t b = a;
    while (b < mine.size() && mine[b].window == mine[a].window) ++b;
    // produce may reuse its buffer at the next call: a payload still to be
    // sent when produce is called again is copied first.
    size_t last_produce = b;
    for (size_t k = a; k < b; ++k) {
      if (mine[k].transfer.from == me) last_produce = k;
    }
    std::vector<PeerTensor> sends, recvs;
    std::vector<std::pair<size_t, size_t>> delivered;  // (transfer, its receive) received outside a landing
    for (size_t k = a; k < b; ++k) {
      const Transfer& t = mine[k].transfer;
      if (t.from == me && t.to == me) {
        cb.deliver(k, cb.produce(k));
      } else if (t.from == me) {
        const at::Tensor payload = produce_checked(cb, mine, k);
        if (t.bytes == 0) continue;  // no message for an empty payload: both ends know it is empty
        at::Tensor wire = payload.to(device).contiguous();
        if (k != last_produce && wire.data_ptr() == payload.data_ptr()) wire = wire.clone();
        sends.push_back(PeerTensor{std::move(wire), t.to, tag_of(mine[k].tag)});
      } else if (t.bytes > 0) {
        at::Tensor landing = cb.landing ? cb.landing(k) : at::Tensor();
        if (!landing.defined()) {
          landing = at::empty({static_cast<int64_t>(t.bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
          delivered.emplace_back(k, recvs.size());
        }
        recvs.push_back(PeerTensor{std::move(landing), t.from, tag_of(mine[k].tag)});
      } else {
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
// keep their order.
std::vector<uint64_t> cut_rounds(const std::vector<Transfer>& transfers, size_t world, uint64_t batch_bytes,
                                 uint64_t& count) {
  struct Cursor {
    uint64_t round = 0;
    uint64_t used = 0;
  };
  std::vector<Cursor> sending(world), receiving(world);
  std::vector<uint64_t> of_transfer(transfers.size());
  count = 0;
  for (size_t k = 0; k < transfers.size(); ++k) {
    const Transfer& t = transfers[k];
    Cursor& out = sending[static_cast<size_t>(t.from)];
    Cursor& in = receiving[static_cast<size_t>(t.to)];
    const uint64_t bytes = t.from == t.to ? 0 : t.bytes;  // to oneself: nothing moves
    uint64_t round = std::max(out.round, in.round);
    const auto used = [&round](const Cursor& c) { return c.round == round ? c.used : 0; };
    const auto full = [&](const Cursor& c) { return used(c) > 0 && used(c) + bytes > batch_bytes; };
    if (full(out) || full(in)) ++round;
    out = Cursor{round, used(out) + bytes};
    if (t.from != t.to) in = Cursor{round, used(in) + bytes};
    of_transfer[k] = round;
    count = std::max(count, round + 1);
  }
  return of_transfer;
}

// Consecutive runs of at most batch_bytes moved; a larger transfer has a window alone.
std::vector<uint64_t> cut_point_to_point(const std::vector<Transfer>& transfers, uint64_t batch_bytes,
                                         uint64_t& count) {
  std::vector<uint64_t> of_transfer(transfers.size());
  uint64_t window = 0, moved = 0;
  for (size_t k = 0; k < transfers.size(); ++k) {
    const uint64_t bytes = transfers[k].from == transfers[k].to ? 0 : transfers[k].bytes;
    if (k > 0 && moved + bytes > batch_bytes) {
      ++window;
      moved = 0;
    }
    moved += bytes;
    of_transfer[k] = window;
  }
  count = transfers.empty() ? 0 : window + 1;
  return of_transfer;
}

// Rounds of one all-to-all each: a rank sends every peer, in one part, the
// payloads of its transfers to that peer in the round, in transfer order.
void run_rounds(Communicator& comm, const std::vector<KeyedTransfer>& mine, const ExchangeCallbacks& cb,
                uint64_t rounds) {
  const int me = comm.rank();
  const size_t world = static_cast<size_t>(comm.size());
  if (!mine.empty() && mine.back().window >= rounds) {
    throw Error(fmt::format("exchange: a transfer in round {} of {}", mine.back().window, rounds));
  }
  std::vector<std::string> parts(world);
  std::map<int, uint64_t> planned;  // bytes expected from each sender this round
  // A peer that sent other bytes than planned is reported after the last
  // round: every rank runs every round's collective, so none is left waiting.
  std::exception_ptr mismatch;
  size_t a = 0;
  for (uint64_t round = 0; round < rounds; ++round) {
    size_t b = a;
    while (b < mine.size() && mine[b].window == round) ++b;
    for (std::string& part : parts) part.clear();
    planned.clear();
    for (size_t k = a; k < b; ++k) {
      const Transfer& t = mine[k].transfer;
      if (t.from == me && t.to == me) {
        cb.deliver(k, cb.produce(k));
      } else if (t.from == me) {
        const at::Tensor payload = produce_checked(cb, mine, k).cpu().contiguous();
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
    for (size_t k = a; k < b; ++k) {
      const Transfer& t = mine[k].transfer;
      if (t.to != me || t.from == me || !matches[static_cast<size_t>(t.from)]) continue;
      uint64_t& offset = at[t.from];
      cb.deliver(k, payload_view(received[static_cast<size_t>(t.from)].data() + offset, t.bytes));
      offset += t.bytes;
    }
    a = b;
  }
  if (mismatch) std::rethrow_exception(mismatch);
}
}  // namespace

void set_payload_tamper_for_testing(PayloadTamper hook) { tamper() = std::move(hook); }

at::Tensor payload_view(const void* data, uint64_t bytes) {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
}

std::vector<KeyedTransfer> cut_windows(const std::vector<Transfer>& transfers, size_t world, ExchangeMode mode,
                                       uint64_t batch_bytes, uint64_t* count) {
  for (size_t k = 0; k < transfers.size(); ++k) {
    const Transfer& t = transfers[k];
    if (t.from < 0 || static_cast<size_t>(t.from) >= world || t.to < 0 || static_cast<size_t>(t.to) >= world) {
      throw Error(
          fmt::format("exchange: transfer {} is from rank {} to rank {} in a world of {}", k, t.from, t.to, world));
    }
  }
  uint64_t windows = 0;
  const std::vector<uint64_t> of_transfer = mode == ExchangeMode::kRounds
                                                ? cut_rounds(transfers, world, batch_bytes, windows)
                                                : cut_point_to_point(transfers, batch_bytes, windows);
  std::vector<KeyedTransfer> keyed(transfers.size());
  for (size_t k = 0; k < transfers.size(); ++k) {
    keyed[k] = KeyedTransfer{transfers[k], of_transfer[k], static_cast<uint32_t>(k)};
  }
  if (count) *count = windows;
  return keyed;
}

void exchange_keyed(Communicator& comm, const std::vector<KeyedTransfer>& mine, const ExchangeCallbacks& callbacks,
                    ExchangeMode mode, uint64_t rounds) {
  check_order(mine, comm.rank());
  if (mode == ExchangeMode::kRounds) {
    run_rounds(comm, mine, callbacks, rounds);
  } else {
    run_point_to_point(comm, mine, callbacks);
  }
}

void exchange(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& callbacks,
              ExchangeMode mode, uint64_t batch_bytes) {
  uint64_t windows = 0;
  const std::vector<KeyedTransfer> all =
      cut_windows(transfers, static_cast<size_t>(comm.size()), mode, batch_bytes, &windows);
  // Rounds sort within a round by transfer index, as cut; the callbacks see
  // the caller's indices.
  std::vector<size_t> index;
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k].transfer.from == comm.rank() || all[k].transfer.to == comm.rank()) index.push_back(k);
  }
  std::stable_sort(index.begin(), index.end(), [&](size_t a, size_t b) { return all[a].window < all[b].window; });
  std::vector<KeyedTransfer> mine;
  mine.reserve(index.size());
  for (const size_t k : index) mine.push_back(all[k]);
  ExchangeCallbacks local;
  local.produce = [&](size_t k) { return callbacks.produce(index[k]); };
  if (callbacks.landing) local.landing = [&](size_t k) { return callbacks.landing(index[k]); };
  local.deliver = [&](size_t k, const at::Tensor& payload) { callbacks.deliver(index[k], payload); };
  exchange_keyed(comm, mine, local, mode, windows);
}

}  // namespace distckpt::comm
