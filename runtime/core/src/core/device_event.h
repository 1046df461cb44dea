// Ordering work between streams of a device (CUDA in CUDA builds of
// LibTorch) through c10's device-generic interface, so that the runtime
// links no CUDA library and compiles against a CPU-only LibTorch too.
//
// c10::Event would do, but LibTorch 1.13's neither exposes its native
// handle (NCCL's stream must wait on it) nor waits on the CPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

namespace distckpt {

class DeviceEvent {
 public:
  explicit DeviceEvent(at::Device device);
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  // Marks the point `stream` has reached; block/query/synchronize refer to it.
  void record(const c10::Stream& stream);
  // `stream` runs nothing queued after this call before the recorded point
  // is reached; the CPU does not wait.
  void block(const c10::Stream& stream) const;
  bool query() const;
  // The CPU waits for the recorded point (by polling: 1.13's interface has
  // no blocking wait on an event).
  void synchronize() const;
  // The native handle (a cudaEvent_t for CUDA); null before record().
  void* native() const { return event_; }
  at::Device device() const { return device_; }

 private:
  at::Device device_;
  void* event_ = nullptr;
};

// `device` with its index: the current device of its type when it names none.
at::Device with_index(at::Device device);

// The stream LibTorch's kernels on `device` currently go to.
c10::Stream current_stream(at::Device device);
// A stream from LibTorch's pool for `device`, for copies that must not wait
// behind the caller's kernels (only behind what they are ordered after).
c10::Stream side_stream(at::Device device);

}  // namespace distckpt
