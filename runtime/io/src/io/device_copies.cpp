#include "io/device_copies.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace distckpt::io {
namespace {

// A side stream that waits for what the caller's current stream has queued.
c10::Stream side_after_current(at::Device device) {
  const c10::Stream side = side_stream(device);
  DeviceEvent queued(device);
  queued.record(current_stream(device));
  queued.block(side);
  return side;
}

// The side stream of `device` in `sides`, made (after the current stream) on first use.
c10::Stream side_of(std::vector<std::pair<at::Device, c10::Stream>>& sides, at::Device device) {
  for (const auto& [d, side] : sides) {
    if (d == device) return side;
  }
  sides.emplace_back(device, side_after_current(device));
  return sides.back().second;
}

// Events after the copies queued on `sides` (cleared); each device's current
// stream waits for them, so the caller's later kernels run after the copies.
std::shared_ptr<const CopiesDone> copies_done(std::vector<std::pair<at::Device, c10::Stream>>& sides) {
  if (sides.empty()) return nullptr;
  auto copies = std::make_shared<CopiesDone>();
  for (const auto& [device, side] : sides) {
    auto finished = std::make_unique<DeviceEvent>(device);
    finished->record(side);
    finished->block(current_stream(device));
    copies->events.push_back(std::move(finished));
  }
  sides.clear();
  return copies;
}

}  // namespace

at::Tensor pinned_host_like(const at::Tensor& like) {
  return at::empty(like.sizes(), at::TensorOptions().dtype(like.scalar_type()).pinned_memory(like.is_cuda()));
}

void CopiesDone::wait() const {
  for (const auto& event : events) event->synchronize();
}

at::Tensor DeviceToHost::copy(const at::Tensor& source) {
  const at::Device device = with_index(source.device());
  const c10::Stream side = side_of(sides_, device);
  at::Tensor host = pinned_host_like(source);
  {
    c10::StreamGuard on_side(side);
    host.copy_(source, /*non_blocking=*/true);
  }
  // The caching allocator must not hand the source's memory to another
  // tensor before the side stream has read it, should the caller free it.
  c10::impl::getDeviceGuardImpl(device.type())->recordDataPtrOnStream(source.storage().data_ptr(), side);
  return host;
}

std::shared_ptr<const CopiesDone> DeviceToHost::done() { return copies_done(sides_); }

void HostToDevice::copy(const at::Tensor& host, const at::Tensor& dest) {
  const at::Device device = with_index(dest.device());
  const c10::Stream side = side_of(sides_, device);
  c10::StreamGuard on_side(side);
  at::Tensor(dest).copy_(host, /*non_blocking=*/true);
  c10::impl::getDeviceGuardImpl(device.type())->recordDataPtrOnStream(dest.storage().data_ptr(), side);
}

std::shared_ptr<const CopiesDone> HostToDevice::done() { return copies_done(sides_); }

}  // namespace distckpt::io
