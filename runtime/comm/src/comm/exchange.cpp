#include "comm/exchange.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>

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

void run_point_to_point(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& cb) {
  const int me = comm.rank();
  const at::Device device = comm.tensor_device();
  for (size_t k = 0; k < transfers.size(); ++k) {
    const Transfer& t = transfers[k];
    if (t.from == me && t.to == me) {
      cb.deliver(k, cb.produce(k));
      continue;
    }
    // No message for an empty payload: both ends know it is empty.
    if (t.from == me) {
      at::Tensor payload = produce_checked(cb, transfers, k);
      if (t.bytes > 0) comm.send_tensor(payload.to(device).contiguous(), t.to, static_cast<int>(k & 0x3fffffff));
    } else if (t.to == me) {
      at::Tensor landing = cb.landing && t.bytes > 0 ? cb.landing(k) : at::Tensor();
      const bool in_place = landing.defined();
      if (!in_place)
        landing = at::empty({static_cast<int64_t>(t.bytes)}, at::TensorOptions().dtype(at::kByte).device(device));
      if (t.bytes > 0) comm.recv_tensor(landing, t.from, static_cast<int>(k & 0x3fffffff));
      if (!in_place) cb.deliver(k, landing);
    }
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
    run_point_to_point(comm, transfers, callbacks);
  }
}

}  // namespace distckpt::comm
