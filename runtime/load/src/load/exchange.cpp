#include "load/exchange.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "distckpt/core/errors.h"
#include "load/slab_copy.h"

namespace distckpt::loading {
namespace {

constexpr uint64_t kStatusBytes = kSlabStatusBytes;
constexpr uint64_t kOk = 0, kFailed = 1;

// The exchange's callbacks: the reader reads each slab once (the current one
// is cached while its needers take their parts), copies its own parts
// straight from it and packs the others'; a needer unpacks.
class SlabExchange {
 public:
  explicit SlabExchange(const ExchangeContext& c) : c_(c) {
    for (const plan::ShareTransfer& t : c_.share.transfers) {
      const uint64_t bytes = t.from == t.to ? 0 : t.bytes + kStatusBytes;
      transfers_.push_back(comm::KeyedTransfer{comm::Transfer{t.from, t.to, bytes}, t.window, t.tag});
    }
  }

  const std::vector<comm::KeyedTransfer>& transfers() const { return transfers_; }
  std::exception_ptr error() const { return error_; }

  at::Tensor produce(size_t k) {
    const plan::ShareTransfer& t = c_.share.transfers[k];
    const bool ok = load_slab(t.piece, t.slab);
    const plan::SharePiece& p = c_.share.pieces[t.piece];
    const at::ScalarType dtype = record_of(p).dtype;
    if (t.other < 0) {
      if (ok) {
        for (uint32_t need : p.own_needs) {
          const TensorRead& r = c_.mine[need];
          copy_slab_to_dest(slab_.data(), p.slabs[t.slab], dtype, r.need.part, r.dest);
        }
      }
      return at::Tensor();  // already in place
    }
    message_.resize(t.bytes + kStatusBytes);
    if (ok) {
      uint64_t at = 0;
      for (const Box& part : p.others[static_cast<size_t>(t.other)].parts) {
        at += pack_from_slab(slab_.data(), p.slabs[t.slab], dtype, part, message_.data() + at);
      }
    }
    const uint64_t status = ok ? kOk : kFailed;
    std::memcpy(message_.data() + t.bytes, &status, kStatusBytes);
    return comm::payload_view(message_.data(), message_.size());
  }

  // A failure the reader reports is not this rank's error: the reader raises
  // its own (the cause) when the ranks agree on errors after the exchange.
  void deliver(size_t k, const at::Tensor& payload) {
    const plan::ShareTransfer& t = c_.share.transfers[k];
    if (t.from == t.to) return;  // own parts: copied by produce
    const at::Tensor host = payload.cpu().contiguous();
    const auto* message = static_cast<const uint8_t*>(host.data_ptr());
    uint64_t status = kFailed;
    std::memcpy(&status, message + t.bytes, kStatusBytes);
    if (status == kFailed) return;
    if (status != kOk) {
      if (!error_) {
        error_ = std::make_exception_ptr(ProtocolError(
            fmt::format("rank {} sent a slab message with status word {} (neither ok nor failed)", t.from, status)));
      }
      return;
    }
    const plan::SharePiece& p = c_.share.pieces[t.piece];
    const at::ScalarType dtype = record_of(p).dtype;
    uint64_t at = 0;
    for (uint32_t need : p.own_needs) {
      const TensorRead& r = c_.mine[need];
      at += unpack_to_dest(message + at, p.slabs[t.slab], dtype, r.need.part, r.dest);
    }
  }

 private:
  const TensorRecord& record_of(const plan::SharePiece& p) const { return c_.reader.tensor_at(p.tensor); }

  // Slab `slab` of piece `piece` in slab_, read once; false (and the error
  // kept) when the read failed.
  bool load_slab(uint32_t piece, uint32_t slab) {
    if (piece == cached_piece_ && slab == cached_slab_) return cached_ok_;
    const plan::SharePiece& p = c_.share.pieces[piece];
    const TensorRecord& record = record_of(p);
    cached_piece_ = piece;
    cached_slab_ = slab;
    slab_.resize(static_cast<size_t>(p.slabs[slab].numel()) * p.geometry.element_size);
    try {
      read_slab(c_.reader, record, c_.reader.index_for(record).pieces().at(p.piece), p.slabs[slab], slab_.data());
      cached_ok_ = true;
    } catch (...) {
      if (!error_) error_ = std::current_exception();
      cached_ok_ = false;
    }
    return cached_ok_;
  }

  const ExchangeContext& c_;
  std::vector<comm::KeyedTransfer> transfers_;
  std::vector<uint8_t> slab_, message_;
  uint32_t cached_piece_ = std::numeric_limits<uint32_t>::max(), cached_slab_ = 0;
  bool cached_ok_ = false;
  std::exception_ptr error_;
};

}  // namespace

std::exception_ptr exchange_shared_pieces(const ExchangeContext& c, comm::ExchangeMode mode, uint64_t rounds) {
  SlabExchange slabs(c);
  comm::ExchangeCallbacks callbacks;
  callbacks.produce = [&](size_t k) { return slabs.produce(k); };
  callbacks.deliver = [&](size_t k, const at::Tensor& payload) { slabs.deliver(k, payload); };
  comm::exchange_keyed(c.comm, slabs.transfers(), callbacks, mode, rounds);
  return slabs.error();
}

}  // namespace distckpt::loading
