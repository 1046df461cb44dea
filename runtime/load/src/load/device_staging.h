// Reads into device (CUDA) tensors land in pinned host memory and are copied
// over from there. Staging a whole state at once would lock as much host
// memory as the rank loads onto its devices (tens of GB for a large model:
// more than hosts allow to be pinned), so a load reads in rounds: each
// round's staged reads fit one window, and two windows alternate, one
// filled by reads while the copies out of the other run. A load then pins at
// most LoadOptions::device_staging_bytes, whatever the size of the state.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "io/device_copies.h"
#include "load/load_requests.h"

namespace distckpt::loading {

class DeviceStaging {
 public:
  // Whether a read's destination is staged. The default stages every one
  // off the CPU; tests stage CPU destinations too (copied at once).
  using Staged = std::function<bool(const at::Tensor& dest)>;
  static bool off_host(const at::Tensor& dest) { return !dest.is_cpu(); }

  // Each staged view starts at a multiple of this, so any dtype may live there.
  static constexpr uint64_t kAlignment = 64;

  // `staging_bytes`: both windows together. Each window is the largest power
  // of two within half of it, at least kAlignment bytes.
  explicit DeviceStaging(uint64_t staging_bytes, Staged staged = off_host);

  // `reads` in rounds, in their order: the first round holds every read that
  // is not staged and the first window of staged ones; each later round one
  // window. A staged read larger than a window is split along its outermost
  // axis longer than one (inner axes too when one row is still too large).
  std::vector<std::vector<TensorRead>> plan_rounds(std::vector<TensorRead> reads);

  // Points round `k`'s staged reads at window k % 2 once the copies out of
  // it (round k - 2's) have run, remembering their destinations. Rounds are
  // staged in order, each delivered before the next is staged.
  void stage(std::vector<TensorRead>& round, size_t k);
  // Queues the copies of the last staged round into their destinations and
  // orders the caller's streams after them; the CPU does not wait.
  void deliver();

  uint64_t window_bytes() const { return window_bytes_; }
  // The most host memory staged at once so far, both windows (for tests).
  uint64_t peak_bytes() const { return peak_bytes_; }

 private:
  struct Window {
    at::Tensor memory;                             // bytes; pinned for device destinations
    std::shared_ptr<const io::CopiesDone> copies;  // the copies out of it still to wait for
  };

  Staged staged_;
  uint64_t window_bytes_;
  uint64_t largest_round_ = 0;  // bytes of the fullest round: what a window needs
  bool pinned_ = false;         // some staged destination is a CUDA tensor
  Window windows_[2];
  size_t current_ = 0;
  std::vector<std::pair<at::Tensor, at::Tensor>> pending_;  // (host view, destination) of the staged round
  uint64_t peak_bytes_ = 0;
};

}  // namespace distckpt::loading
