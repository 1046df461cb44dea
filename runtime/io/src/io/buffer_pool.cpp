#include "io/buffer_pool.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>

#include <cstdlib>
#include <new>

#include "distckpt/core/errors.h"

namespace distckpt::io {

BufferPool::Buffer::Buffer(Buffer&& other) noexcept
    : pool_(std::move(other.pool_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

BufferPool::Buffer& BufferPool::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::move(other.pool_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

BufferPool::Buffer::~Buffer() { release(); }

void BufferPool::Buffer::release() {
  if (data_ && pool_) pool_->release(data_, size_);
  data_ = nullptr;
  size_ = 0;
  pool_.reset();
}

std::shared_ptr<BufferPool> BufferPool::create(Options options) {
  if (options.pinned && !at::hasCUDA()) {
    throw UsageError("BufferPool: pinned buffers need a CUDA build of LibTorch; leave Options::pinned false");
  }
  std::shared_ptr<BufferPool> pool(new BufferPool(options));
  pool->self_ = pool;
  return pool;
}

BufferPool::~BufferPool() {
  // Every Buffer holds a reference, so all buffers are free by now.
  for (auto& [size, list] : free_) {
    for (uint8_t* data : list) deallocate(data, size);
  }
}

uint64_t BufferPool::size_class(uint64_t bytes) {
  uint64_t c = kMinClass;
  while (c < bytes) c <<= 1;
  return c;
}

uint8_t* BufferPool::allocate(uint64_t size) {
  if (options_.pinned) {
    at::Tensor t = at::empty({static_cast<int64_t>(size)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    auto* data = static_cast<uint8_t*>(t.data_ptr());
    pinned_owners_[data] = std::make_shared<at::Tensor>(std::move(t));
    return data;
  }
  void* data = nullptr;
  if (::posix_memalign(&data, kAlignment, size) != 0) throw std::bad_alloc();
  return static_cast<uint8_t*>(data);
}

void BufferPool::deallocate(uint8_t* data, uint64_t /*size*/) {
  if (options_.pinned) {
    pinned_owners_.erase(data);
    return;
  }
  std::free(data);
}

void BufferPool::free_unused_locked(uint64_t needed) {
  for (auto it = free_.begin(); it != free_.end() && allocated_ + needed > options_.capacity_bytes;) {
    while (!it->second.empty() && allocated_ + needed > options_.capacity_bytes) {
      deallocate(it->second.back(), it->first);
      it->second.pop_back();
      allocated_ -= it->first;
    }
    it = it->second.empty() ? free_.erase(it) : std::next(it);
  }
}

std::optional<BufferPool::Buffer> BufferPool::try_acquire(uint64_t bytes) {
  const uint64_t size = size_class(bytes);
  if (options_.capacity_bytes != 0 && size > options_.capacity_bytes) {
    throw UsageError(
        fmt::format("a staging buffer of {} bytes does not fit a pool of {} bytes; raise the pool capacity", size,
                    options_.capacity_bytes));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    uint8_t* data = it->second.back();
    it->second.pop_back();
    in_use_ += size;
    return Buffer(self_.lock(), data, size);
  }
  const bool at_capacity = options_.capacity_bytes != 0 && allocated_ + size > options_.capacity_bytes;
  // A free larger buffer serves the request: at capacity always (freeing
  // buffers to allocate others would fault in fresh pages on every save),
  // below it when at most 4x larger (the pool reaches its steady state in
  // fewer saves, wasting at most 3/4 of a buffer).
  for (auto larger = free_.upper_bound(size); larger != free_.end(); ++larger) {
    if (!at_capacity && larger->first > 4 * size) break;
    if (larger->second.empty()) continue;
    uint8_t* data = larger->second.back();
    larger->second.pop_back();
    in_use_ += larger->first;
    return Buffer(self_.lock(), data, larger->first);
  }
  if (at_capacity) {
    free_unused_locked(size);
    if (allocated_ + size > options_.capacity_bytes) return std::nullopt;
  }
  uint8_t* data = allocate(size);
  allocated_ += size;
  peak_ = std::max(peak_, allocated_);
  in_use_ += size;
  return Buffer(self_.lock(), data, size);
}

BufferPool::Buffer BufferPool::acquire(uint64_t bytes) {
  while (true) {
    if (auto buffer = try_acquire(bytes)) return std::move(*buffer);
    std::unique_lock<std::mutex> lock(mutex_);
    released_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

void BufferPool::release(uint8_t* data, uint64_t size) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[size].push_back(data);
    in_use_ -= size;
  }
  released_.notify_all();
}

uint64_t BufferPool::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_;
}

uint64_t BufferPool::peak_allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

uint64_t BufferPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

void BufferPool::trim() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, list] : free_) {
    for (uint8_t* data : list) {
      deallocate(data, size);
      allocated_ -= size;
    }
  }
  free_.clear();
}

}  // namespace distckpt::io
