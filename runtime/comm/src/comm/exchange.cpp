#include "comm/exchange.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
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

// rounds[r]: the transfers sent by rank r, cut in global order into rounds
// of at most batch_bytes (a transfer larger than that has a round alone).
std::vector<std::vector<std::vector<size_t>>> cut_rounds(const std::vector<Transfer>& transfers, size_t world,
                                                         uint64_t batch_bytes) {
  std::vector<std::vector<std::vector<size_t>>> rounds(world);
  std::vector<uint64_t> filled(world, 0);
  for (size_t k = 0; k < transfers.size(); ++k) {
    const Transfer& t = transfers[k];
    if (t.from < 0 || static_cast<size_t>(t.from) >= world || t.to < 0 || static_cast<size_t>(t.to) >= world) {
      throw Error(
          fmt::format("exchange: transfer {} is from rank {} to rank {} in a world of {}", k, t.from, t.to, world));
    }
    auto& mine = rounds[static_cast<size_t>(t.from)];
    uint64_t& used = filled[static_cast<size_t>(t.from)];
    const uint64_t bytes = t.from == t.to ? 0 : t.bytes;  // sent to oneself: nothing contributed
    if (mine.empty() || (used > 0 && used + bytes > batch_bytes)) {
      mine.emplace_back();
      used = 0;
    }
    mine.back().push_back(k);
    used += bytes;
  }
  return rounds;
}

void run_all_gather(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& cb,
                    uint64_t batch_bytes) {
  const int me = comm.rank();
  const size_t world = static_cast<size_t>(comm.size());
  const auto rounds = cut_rounds(transfers, world, batch_bytes);
  size_t round_count = 0;
  for (const auto& r : rounds) round_count = std::max(round_count, r.size());
  const auto& my_rounds = rounds[static_cast<size_t>(me)];
  std::string contribution;
  for (size_t round = 0; round < round_count; ++round) {
    contribution.clear();
    if (round < my_rounds.size()) {
      for (size_t k : my_rounds[round]) {
        if (transfers[k].to == me) {
          cb.deliver(k, cb.produce(k));
          continue;
        }
        const at::Tensor payload = produce_checked(cb, transfers, k).cpu().contiguous();
        contribution.append(static_cast<const char*>(payload.data_ptr()), transfers[k].bytes);
      }
    }
    const std::vector<std::string> gathered = comm.all_gather_bytes(contribution);
    for (size_t from = 0; from < world; ++from) {
      if (static_cast<int>(from) == me || round >= rounds[from].size()) continue;
      uint64_t planned = 0;
      for (size_t k : rounds[from][round]) planned += transfers[k].to == transfers[k].from ? 0 : transfers[k].bytes;
      if (gathered[from].size() != planned) {
        throw ProtocolError(fmt::format("exchange round {}: rank {} sent {} bytes, {} planned", round, from,
                                        gathered[from].size(), planned));
      }
      uint64_t at = 0;
      for (size_t k : rounds[from][round]) {
        const Transfer& t = transfers[k];
        if (t.to == t.from) continue;
        if (t.to == me) cb.deliver(k, payload_view(gathered[from].data() + at, t.bytes));
        at += t.bytes;
      }
    }
  }
}

}  // namespace

at::Tensor payload_view(const void* data, uint64_t bytes) {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
}

void exchange(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& callbacks,
              ExchangeMode mode, uint64_t batch_bytes) {
  if (mode == ExchangeMode::kAllGather) {
    run_all_gather(comm, transfers, callbacks, batch_bytes);
  } else {
    run_point_to_point(comm, transfers, callbacks, batch_bytes);
  }
}

}  // namespace distckpt::comm
