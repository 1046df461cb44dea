#include "load/exchange.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "distckpt/core/errors.h"
#include "load/slab_copy.h"

namespace distckpt::loading {
namespace {

constexpr uint64_t kStatusBytes = sizeof(uint64_t);
constexpr uint64_t kOk = 0, kFailed = 1;
using Needer = plan::SharedPiece::Needer;

// One transfer: slab `slab` of shared piece `shared`, for `needer`.
struct SlabPart {
  size_t shared;
  size_t slab;
  const Needer* needer;
  uint64_t bytes;  // the needer's elements, without the status word
};

// The exchange's callbacks: the reader reads each slab once (the current one
// is cached while its needers take their parts), copies its own parts
// straight from it and packs the others'; a needer unpacks.
class SlabExchange {
 public:
  explicit SlabExchange(const ExchangeContext& c) : c_(c) { list_transfers(); }

  const std::vector<comm::Transfer>& transfers() const { return transfers_; }
  std::exception_ptr error() const { return error_; }

  at::Tensor produce(size_t k) {
    const SlabPart& p = parts_[k];
    const bool ok = load_slab(p.shared, p.slab);
    const plan::SharedPiece& s = c_.schedule.shared[p.shared];
    const TensorRecord& record = record_of(s);
    if (p.needer->rank == c_.comm.rank()) {
      if (ok) {
        for (uint32_t need : p.needer->needs) {
          const TensorRead& r = c_.mine[need];
          copy_slab_to_dest(slab_.data(), s.slabs[p.slab], record.dtype, r.need.part, r.dest);
        }
      }
      return at::Tensor();  // already in place
    }
    message_.resize(p.bytes + kStatusBytes);
    if (ok) {
      uint64_t at = 0;
      for (uint32_t need : p.needer->needs) {
        at += pack_from_slab(slab_.data(), s.slabs[p.slab], record.dtype,
                             c_.needs[static_cast<size_t>(p.needer->rank)][need].part, message_.data() + at);
      }
    }
    const uint64_t status = ok ? kOk : kFailed;
    std::memcpy(message_.data() + p.bytes, &status, kStatusBytes);
    return comm::payload_view(message_.data(), message_.size());
  }

  // A failure the reader reports is not this rank's error: the reader raises
  // its own (the cause) when the ranks agree on errors after the exchange.
  void deliver(size_t k, const at::Tensor& payload) {
    const SlabPart& p = parts_[k];
    if (p.needer->rank == transfers_[k].from) return;  // own parts: copied by produce
    const at::Tensor host = payload.cpu().contiguous();
    const auto* message = static_cast<const uint8_t*>(host.data_ptr());
    uint64_t status = kFailed;
    std::memcpy(&status, message + p.bytes, kStatusBytes);
    if (status == kFailed) return;
    if (status != kOk) {
      if (!error_) {
        error_ = std::make_exception_ptr(ProtocolError(fmt::format(
            "rank {} sent a slab message with status word {} (neither ok nor failed)", transfers_[k].from, status)));
      }
      return;
    }
    const plan::SharedPiece& s = c_.schedule.shared[p.shared];
    const TensorRecord& record = record_of(s);
    uint64_t at = 0;
    for (uint32_t need : p.needer->needs) {
      const TensorRead& r = c_.mine[need];
      at += unpack_to_dest(message + at, s.slabs[p.slab], record.dtype, r.need.part, r.dest);
    }
  }

 private:
  // Per slab: the reader's own parts first (a transfer to itself, so the
  // slab is read even when nobody else needs it), then each other needer's.
  void list_transfers() {
    for (size_t k = 0; k < c_.schedule.shared.size(); ++k) {
      const plan::SharedPiece& s = c_.schedule.shared[k];
      if (s.same_host) continue;  // load/host_exchange.h
      for (size_t i = 0; i < s.slabs.size(); ++i) {
        for (const Needer& n : s.needers) {
          if (n.rank != s.reader) continue;
          parts_.push_back(SlabPart{k, i, &n, 0});
          transfers_.push_back(comm::Transfer{s.reader, s.reader, 0});
        }
        for (const Needer& n : s.needers) {
          if (n.rank == s.reader) continue;
          const uint64_t bytes = s.message_bytes(c_.needs, n, i);
          if (bytes == 0) continue;
          parts_.push_back(SlabPart{k, i, &n, bytes});
          transfers_.push_back(comm::Transfer{s.reader, n.rank, bytes + kStatusBytes});
        }
      }
    }
  }

  const TensorRecord& record_of(const plan::SharedPiece& s) const { return c_.reader.index().tensors.at(s.tensor); }

  // Slab `slab` of shared piece `shared` in slab_, read once; false (and the
  // error kept) when the read failed.
  bool load_slab(size_t shared, size_t slab) {
    if (shared == cached_shared_ && slab == cached_slab_) return cached_ok_;
    const plan::SharedPiece& s = c_.schedule.shared[shared];
    const TensorRecord& record = record_of(s);
    cached_shared_ = shared;
    cached_slab_ = slab;
    slab_.resize(static_cast<size_t>(s.slabs[slab].numel()) * s.geometry.element_size);
    try {
      read_slab(c_.reader, record, c_.reader.index_for(record).pieces().at(s.piece), s.slabs[slab], slab_.data());
      cached_ok_ = true;
    } catch (...) {
      if (!error_) error_ = std::current_exception();
      cached_ok_ = false;
    }
    return cached_ok_;
  }

  const ExchangeContext& c_;
  std::vector<SlabPart> parts_;
  std::vector<comm::Transfer> transfers_;
  std::vector<uint8_t> slab_, message_;
  size_t cached_shared_ = std::numeric_limits<size_t>::max(), cached_slab_ = 0;
  bool cached_ok_ = false;
  std::exception_ptr error_;
};

}  // namespace

std::exception_ptr exchange_shared_pieces(const ExchangeContext& c, comm::ExchangeMode mode) {
  SlabExchange slabs(c);
  comm::ExchangeCallbacks callbacks;
  callbacks.produce = [&](size_t k) { return slabs.produce(k); };
  callbacks.deliver = [&](size_t k, const at::Tensor& payload) { slabs.deliver(k, payload); };
  comm::exchange(c.comm, slabs.transfers(), callbacks, mode, c.batch_bytes);
  return slabs.error();
}

}  // namespace distckpt::loading
