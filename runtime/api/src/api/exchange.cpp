#include "api/exchange.h"

#include <ATen/Functions.h>
#include <fmt/format.h>
#include <cstring>

#include "api/slab_copy.h"
#include "distckpt/core/errors.h"

namespace distckpt::api {
namespace {

constexpr uint64_t kStatusBytes = sizeof(uint64_t);
constexpr uint64_t kOk = 0, kFailed = 1;
using SharedPieceNeeder = plan::SharedPiece::Needer;

const SharedPieceNeeder* find_needer(const plan::SharedPiece& s, int rank) {
  for (const auto& n : s.needers) {
    if (n.rank == rank) return &n;
  }
  return nullptr;
}

class SlabWork {
 public:
  SlabWork(const ExchangeContext& c, const plan::SharedPiece& s)
      : c_(c),
        s_(s),
        record_(c.reader.metadata().tensors.at(s.tensor)),
        piece_(c.reader.index_for(record_).pieces().at(s.piece)) {}

  // Reads slab `i` into the buffer; false (and the error kept) on failure.
  bool read(size_t i, std::vector<uint8_t>& buffer, std::exception_ptr& error) {
    buffer.resize(static_cast<size_t>(s_.slabs[i].numel()) * s_.geometry.element_size);
    try {
      read_slab(c_.reader, record_, piece_, s_.slabs[i], buffer.data());
      return true;
    } catch (...) {
      if (!error) error = std::current_exception();
      return false;
    }
  }

  // This rank's own parts, straight from the slab.
  void copy_own(const SharedPieceNeeder& me, size_t i, const std::vector<uint8_t>& slab) const {
    for (uint32_t need : me.needs) {
      const TensorRead& r = c_.mine[need];
      copy_slab_to_dest(slab.data(), s_.slabs[i], record_.dtype, r.need.part, r.dest);
    }
  }

  // `needer`'s parts of slab `i`, packed at `out`; then the status word.
  void pack(const SharedPieceNeeder& needer, size_t i, const std::vector<uint8_t>& slab, bool ok, uint8_t* out) const {
    uint64_t at = 0;
    if (ok) {
      for (uint32_t need : needer.needs) {
        at += pack_from_slab(slab.data(), s_.slabs[i], record_.dtype,
                             c_.needs[static_cast<size_t>(needer.rank)][need].part, out + at);
      }
    } else {
      at = s_.message_bytes(c_.needs, needer, i);
    }
    const uint64_t status = ok ? kOk : kFailed;
    std::memcpy(out + at, &status, kStatusBytes);
  }

  // Unpacks a message for this rank. A failure the reader reports is not
  // this rank's error: the reader raises its own (the cause) when the ranks
  // agree on errors after the exchange, and every rank fails then.
  void unpack(const SharedPieceNeeder& me, size_t i, const uint8_t* message, uint64_t bytes) const {
    uint64_t status = kFailed;
    std::memcpy(&status, message + bytes, kStatusBytes);
    if (status != kOk) return;
    uint64_t at = 0;
    for (uint32_t need : me.needs) {
      const TensorRead& r = c_.mine[need];
      at += unpack_to_dest(message + at, s_.slabs[i], record_.dtype, r.need.part, r.dest);
    }
  }

 private:
  const ExchangeContext& c_;
  const plan::SharedPiece& s_;
  const TensorRecord& record_;
  const plan::StoredPiece& piece_;
};

// A host buffer as a tensor the communicator can move.
at::Tensor wire_tensor(std::vector<uint8_t>& host, uint64_t bytes, const at::Device& device) {
  at::Tensor t = at::from_blob(host.data(), {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace

std::exception_ptr exchange_broadcast(const ExchangeContext& c) {
  std::exception_ptr error;
  const int me = c.comm.rank();
  const at::Device device = c.comm.tensor_device();
  std::vector<uint8_t> slab, message;
  for (size_t k = 0; k < c.schedule.shared.size(); ++k) {
    const plan::SharedPiece& s = c.schedule.shared[k];
    const SharedPieceNeeder* mine = find_needer(s, me);
    if (!mine) continue;
    const int tag = static_cast<int>(k & 0x3fffffff);
    SlabWork work(c, s);
    for (size_t i = 0; i < s.slabs.size(); ++i) {
      if (s.reader == me) {
        const bool ok = work.read(i, slab, error);
        if (ok) work.copy_own(*mine, i, slab);
        for (const auto& needer : s.needers) {
          if (needer.rank == me) continue;
          const uint64_t bytes = s.message_bytes(c.needs, needer, i);
          if (bytes == 0) continue;
          message.resize(bytes + kStatusBytes);
          work.pack(needer, i, slab, ok, message.data());
          c.comm.send_tensor(wire_tensor(message, bytes + kStatusBytes, device), needer.rank, tag);
        }
        continue;
      }
      const uint64_t bytes = s.message_bytes(c.needs, *mine, i);
      if (bytes == 0) continue;
      message.resize(bytes + kStatusBytes);
      at::Tensor wire = wire_tensor(message, bytes + kStatusBytes, device);
      c.comm.recv_tensor(wire, s.reader, tag);
      if (!device.is_cpu()) {
        at::from_blob(message.data(), {wire.numel()}, at::TensorOptions().dtype(at::kByte)).copy_(wire);
      }
      work.unpack(*mine, i, message.data(), bytes);
    }
  }
  return error;
}

namespace {

// One slab a reader contributes to a round, with the messages it makes.
struct Unit {
  size_t shared;
  size_t slab;
  uint64_t bytes;  // messages + status words
};

// Every reader's units, cut into rounds of about `batch` bytes each (a slab
// never spans two rounds). rounds[reader][round] = units.
std::vector<std::vector<std::vector<Unit>>> plan_rounds(const ExchangeContext& c, size_t world) {
  std::vector<std::vector<std::vector<Unit>>> rounds(world);
  std::vector<uint64_t> filled(world, 0);
  for (size_t k = 0; k < c.schedule.shared.size(); ++k) {
    const plan::SharedPiece& s = c.schedule.shared[k];
    auto& mine = rounds[static_cast<size_t>(s.reader)];
    uint64_t& used = filled[static_cast<size_t>(s.reader)];
    for (size_t i = 0; i < s.slabs.size(); ++i) {
      uint64_t bytes = 0;
      for (const auto& n : s.needers) {
        if (n.rank == s.reader) continue;
        const uint64_t m = s.message_bytes(c.needs, n, i);
        if (m > 0) bytes += m + kStatusBytes;
      }
      if (mine.empty() || (used > 0 && used + bytes > c.batch_bytes)) {
        mine.emplace_back();
        used = 0;
      }
      mine.back().push_back(Unit{k, i, bytes});
      used += bytes;
    }
  }
  return rounds;
}

}  // namespace

std::exception_ptr exchange_all_gather(const ExchangeContext& c) {
  std::exception_ptr error;
  const int me = c.comm.rank();
  const size_t world = static_cast<size_t>(c.comm.size());
  const auto rounds = plan_rounds(c, world);
  size_t round_count = 0;
  for (const auto& r : rounds) round_count = std::max(round_count, r.size());
  std::vector<uint8_t> slab;
  std::string contribution;
  for (size_t round = 0; round < round_count; ++round) {
    contribution.clear();
    const auto& my_rounds = rounds[static_cast<size_t>(me)];
    if (round < my_rounds.size()) {
      for (const Unit& u : my_rounds[round]) {
        const plan::SharedPiece& s = c.schedule.shared[u.shared];
        SlabWork work(c, s);
        const bool ok = work.read(u.slab, slab, error);
        if (ok) work.copy_own(*find_needer(s, me), u.slab, slab);
        for (const auto& needer : s.needers) {
          if (needer.rank == me) continue;
          const uint64_t bytes = s.message_bytes(c.needs, needer, u.slab);
          if (bytes == 0) continue;
          const size_t at = contribution.size();
          contribution.resize(at + bytes + kStatusBytes);
          work.pack(needer, u.slab, slab, ok, reinterpret_cast<uint8_t*>(contribution.data() + at));
        }
      }
    }
    const std::vector<std::string> gathered = c.comm.all_gather_bytes(contribution);
    for (size_t reader = 0; reader < world; ++reader) {
      if (static_cast<int>(reader) == me || round >= rounds[reader].size()) continue;
      const auto* data = reinterpret_cast<const uint8_t*>(gathered[reader].data());
      uint64_t at = 0;
      for (const Unit& u : rounds[reader][round]) {
        const plan::SharedPiece& s = c.schedule.shared[u.shared];
        for (const auto& needer : s.needers) {
          if (needer.rank == static_cast<int>(reader)) continue;
          const uint64_t bytes = s.message_bytes(c.needs, needer, u.slab);
          if (bytes == 0) continue;
          if (at + bytes + kStatusBytes > gathered[reader].size()) {
            throw CommError(fmt::format("all-gather exchange: rank {} sent {} bytes, fewer than planned", reader,
                                        gathered[reader].size()));
          }
          if (needer.rank == me) SlabWork(c, s).unpack(needer, u.slab, data + at, bytes);
          at += bytes + kStatusBytes;
        }
      }
    }
  }
  return error;
}

}  // namespace distckpt::api
