#include "api/save_items.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <cstring>

#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "io/stream_copy.h"

namespace distckpt::api {
namespace {

// Buffers of synchronous writes: a small, bounded pool kept for the life of
// the process, so each save copies into warm memory (see io/buffer_pool.h).
constexpr uint64_t kSyncPoolBytes = uint64_t{64} << 20;

io::WriteItem tensor_item(const ShardedTensor& tensor, int rank) {
  if (!tensor.data.defined()) {
    throw ShardingError(fmt::format("rank {} cannot save {}: it has no data", rank, tensor.describe()));
  }
  at::Tensor data = tensor.data.detach();
  if (data.numel() != tensor.held_numel() || data.scalar_type() != tensor.dtype) {
    throw ShardingError(fmt::format("rank {} cannot save {}: its data has {} elements of {}, expected {} of {}", rank,
                                    tensor.describe(), data.numel(), dtype_name(data.scalar_type()),
                                    tensor.held_numel(), dtype_name(tensor.dtype)));
  }
  return tensor_write_item(data);
}

io::WriteItem object_item(const ShardedObject& object) {
  auto bytes = std::make_shared<const std::string>(object.data);  // the caller may change it after staging
  return io::WriteItem{bytes->size(), [bytes](uint64_t offset, uint64_t n, uint8_t* dst) {
                         std::memcpy(dst, bytes->data() + offset, n);
                       }};
}

}  // namespace

const std::shared_ptr<io::BufferPool>& sync_write_pool() {
  static const std::shared_ptr<io::BufferPool> pool = io::BufferPool::create({kSyncPoolBytes, false});
  return pool;
}

io::WriteItem tensor_write_item(at::Tensor data) {
  if (!data.is_contiguous()) data = data.contiguous();  // the one case that needs a copy of the whole shard
  const uint64_t bytes = static_cast<uint64_t>(data.numel()) * data.element_size();
  if (data.device().is_cpu()) {
    return io::WriteItem{bytes, [data](uint64_t offset, uint64_t n, uint8_t* dst) {
                           io::stream_copy(dst, static_cast<const uint8_t*>(data.data_ptr()) + offset, n);
                         }};
  }
  return io::WriteItem{bytes, [data](uint64_t offset, uint64_t n, uint8_t* dst) {
                         const auto byte = at::TensorOptions().dtype(at::kByte);
                         at::Tensor source = at::from_blob(static_cast<uint8_t*>(data.data_ptr()) + offset,
                                                           {static_cast<int64_t>(n)}, byte.device(data.device()));
                         at::from_blob(dst, {static_cast<int64_t>(n)}, byte).copy_(source);
                       }};
}

std::vector<io::WriteItem> make_write_items(const PreparedSave& p) {
  std::vector<io::WriteItem> items;
  items.reserve(p.assignment.size());
  const size_t n = p.tensors.size();
  for (uint32_t i : p.assignment) {
    items.push_back(i < n ? tensor_item(*p.tensors[i], p.rank) : object_item(*p.objects[i - n]));
  }
  return items;
}

}  // namespace distckpt::api
