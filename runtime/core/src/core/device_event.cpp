#include "core/device_event.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace distckpt {
namespace {

const c10::impl::DeviceGuardImplInterface& guard_of(at::Device device) {
  return *c10::impl::getDeviceGuardImpl(device.type());
}

}  // namespace

at::Device with_index(at::Device device) { return device.has_index() ? device : guard_of(device).getDevice(); }

DeviceEvent::DeviceEvent(at::Device device) : device_(with_index(device)) {}

DeviceEvent::~DeviceEvent() {
  if (event_ != nullptr) guard_of(device_).destroyEvent(event_, device_.index());
}

void DeviceEvent::record(const c10::Stream& stream) {
  guard_of(device_).record(&event_, stream, device_.index(), c10::EventFlag::PYTORCH_DEFAULT);
}

void DeviceEvent::block(const c10::Stream& stream) const {
  if (event_ != nullptr) guard_of(device_).block(event_, stream);
}

bool DeviceEvent::query() const { return event_ == nullptr || guard_of(device_).queryEvent(event_); }

void DeviceEvent::synchronize() const {
  // Copies of a checkpoint's shards take milliseconds to seconds: start
  // with short sleeps, settle at a tenth of a millisecond.
  auto pause = std::chrono::microseconds(5);
  while (!query()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(100));
  }
}

c10::Stream current_stream(at::Device device) {
  const at::Device d = with_index(device);
  return guard_of(d).getStream(d);
}

c10::Stream side_stream(at::Device device) {
  const at::Device d = with_index(device);
  return guard_of(d).getStreamFromGlobalPool(d, /*isHighPriority=*/false);
}

}  // namespace distckpt
