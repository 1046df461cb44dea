// Saving from and loading into device (CUDA) tensors: bytes move between
// the device and pinned host memory with asynchronous copies on a side
// stream, ordered against the caller's current stream by events: the copies
// start after the kernels the caller has queued (which produce or use the
// tensors), and kernels the caller queues later start after the copies. No
// device-wide synchronisation, and the CPU waits only where it reads the
// host bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

#include "core/device_event.h"

namespace distckpt::io {

// A host tensor shaped like `like`, in page-locked memory when `like` lives
// on a CUDA device (LibTorch's caching host allocator reuses it).
at::Tensor pinned_host_like(const at::Tensor& like);

// The point a batch of copies reaches on each device it used.
struct CopiesDone {
  std::vector<std::unique_ptr<DeviceEvent>> events;
  void wait() const;  // the CPU waits for all of them
};

// Device -> host, for saves.
class DeviceToHost {
 public:
  // Queues the copy of `source` (on a device) into a new pinned host tensor,
  // returned at once; its bytes are valid once done()'s result was waited for.
  at::Tensor copy(const at::Tensor& source);
  // Orders the caller's streams after the copies queued so far and returns
  // what the CPU waits for before reading the host tensors (null when
  // nothing was queued).
  std::shared_ptr<const CopiesDone> done();

 private:
  std::vector<std::pair<at::Device, c10::Stream>> sides_;  // a rank's tensors are normally on one device
};

// Host -> device, for loads.
class HostToDevice {
 public:
  // Queues the copy of `host` (pinned) into `dest` (on a device).
  void copy(const at::Tensor& host, const at::Tensor& dest);
  // Orders the caller's streams after the copies queued so far and returns
  // what the CPU waits for before reusing the host memory (null when nothing
  // was queued). The CPU does not wait here: host tensors from LibTorch's
  // caching host allocator stay reserved until their copies ran.
  std::shared_ptr<const CopiesDone> done();

 private:
  std::vector<std::pair<at::Device, c10::Stream>> sides_;
};

}  // namespace distckpt::io
