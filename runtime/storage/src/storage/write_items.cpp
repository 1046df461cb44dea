#include "storage/write_items.h"

#include <ATen/Functions.h>
#include <c10/core/StreamGuard.h>

#include <cstring>
#include <utility>

#include "core/device_event.h"
#include "io/stream_copy.h"

namespace distckpt::storage {
namespace {

// Buffers of synchronous writes: a small, bounded pool kept for the life of
// the process, so each save copies into warm memory (see io/buffer_pool.h).
constexpr uint64_t kSyncPoolBytes = uint64_t{64} << 20;

// What `device`'s current stream has queued by now, recorded once per save.
std::shared_ptr<const DeviceEvent> queued_on(
    std::vector<std::pair<at::Device, std::shared_ptr<const DeviceEvent>>>& queued, at::Device device) {
  for (const auto& [d, event] : queued) {
    if (d == device) return event;
  }
  auto event = std::make_shared<DeviceEvent>(device);
  event->record(current_stream(device));
  queued.emplace_back(device, event);
  return event;
}

// Copies slices of device `data` into the writer's buffers on the calling
// writer thread, each on a side stream that first waits for `queued`; the
// thread waits for its copy (the buffer is written out next).
io::WriteItem device_write_item(const at::Tensor& data, std::shared_ptr<const DeviceEvent> queued) {
  const uint64_t bytes = static_cast<uint64_t>(data.numel()) * data.element_size();
  return io::WriteItem{bytes, [data, queued](uint64_t offset, uint64_t n, uint8_t* dst) {
                         const at::Device device = queued->device();
                         const c10::Stream side = side_stream(device);
                         // The guard first: on a writer thread, whose device is 0, block()'s own
                         // switch back would set device 0 and so make a CUDA context there.
                         c10::StreamGuard on_side(side);
                         queued->block(side);
                         const auto length = static_cast<int64_t>(n);
                         const at::Tensor source =
                             at::from_blob(static_cast<uint8_t*>(data.data_ptr()) + offset, {length},
                                           at::TensorOptions().dtype(at::kByte).device(device));
                         at::from_blob(dst, {length}, at::kByte).copy_(source);  // returns once copied
                       }};
}

}  // namespace

const std::shared_ptr<io::BufferPool>& sync_write_pool() {
  static const std::shared_ptr<io::BufferPool> pool = io::BufferPool::create({kSyncPoolBytes, false});
  return pool;
}

const std::shared_ptr<io::BufferPool>& pinned_sync_write_pool() {
  // Made on first use only: pinning memory starts CUDA, which a CPU job must not pay for.
  static const std::shared_ptr<io::BufferPool> pool = io::BufferPool::create({kSyncPoolBytes, true});
  return pool;
}

io::WriteItem tensor_write_item(at::Tensor data, std::shared_ptr<const io::CopiesDone> pending) {
  if (!data.is_contiguous()) data = data.contiguous();  // the one case that needs a copy of the whole shard
  const uint64_t bytes = static_cast<uint64_t>(data.numel()) * data.element_size();
  return io::WriteItem{bytes, [data, pending](uint64_t offset, uint64_t n, uint8_t* dst) {
                         if (pending) pending->wait();  // returns at once once the copies ran
                         io::stream_copy(dst, static_cast<const uint8_t*>(data.data_ptr()) + offset, n);
                       }};
}

std::vector<io::WriteItem> write_items_of(const std::vector<SavePiece>& pieces,
                                          const std::shared_ptr<const io::CopiesDone>& pending) {
  std::vector<io::WriteItem> items;
  items.reserve(pieces.size());
  std::vector<std::pair<at::Device, std::shared_ptr<const DeviceEvent>>> queued;  // per device: the values to save
  for (const SavePiece& piece : pieces) {
    if (!piece.object) {
      items.push_back(piece.data.is_cpu()
                          ? tensor_write_item(piece.data, pending)
                          : device_write_item(piece.data, queued_on(queued, with_index(piece.data.device()))));
      continue;
    }
    items.push_back(
        io::WriteItem{piece.object->size(), [bytes = piece.object](uint64_t offset, uint64_t n, uint8_t* dst) {
                        std::memcpy(dst, bytes->data() + offset, n);
                      }});
  }
  return items;
}

}  // namespace distckpt::storage
