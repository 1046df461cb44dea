// Page-aligned host buffers that outlive a save and are reused by the next.
//
// Why: on virtual machines the first touch of fresh pages can run at a tenth
// of memcpy speed, so staging a save into new memory every time would cost
// more than the copy. Buffers come in power-of-two size classes (64 KiB up),
// are kept when released, and the pool never holds more than its capacity.
// A pool may be pinned (page-locked, with a CUDA build of LibTorch) when
// device shards are copied straight into its buffers, at full speed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace distckpt::io {

class BufferPool {
 public:
  struct Options {
    uint64_t capacity_bytes = 0;  // 0: no bound (the pool grows to what is used at once)
    bool pinned = false;          // page-locked memory (needs a CUDA build of LibTorch)
  };

  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept;
    Buffer& operator=(Buffer&& other) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer();  // back to the pool

    uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }  // the size class, >= what was asked for
    explicit operator bool() const { return data_ != nullptr; }

   private:
    friend class BufferPool;
    Buffer(std::shared_ptr<BufferPool> pool, uint8_t* data, uint64_t size)
        : pool_(std::move(pool)), data_(data), size_(size) {}
    void release();
    std::shared_ptr<BufferPool> pool_;
    uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
  };

  static constexpr uint64_t kMinClass = uint64_t{64} << 10;
  static constexpr uint64_t kAlignment = 4096;

  // Pools are shared: buffers keep their pool alive.
  static std::shared_ptr<BufferPool> create(Options options);
  ~BufferPool();

  // The size class a request of `bytes` gets.
  static uint64_t size_class(uint64_t bytes);

  // A buffer of at least `bytes`: a free one of its class, a new one, or at
  // capacity a free larger one; else free smaller unused buffers to make
  // room; else nothing (other buffers are in use). Throws UsageError if `bytes`
  // can never fit.
  std::optional<Buffer> try_acquire(uint64_t bytes);
  // Blocks until try_acquire succeeds.
  Buffer acquire(uint64_t bytes);

  uint64_t allocated_bytes() const;  // held by the pool, in use or free
  uint64_t peak_allocated_bytes() const;
  uint64_t in_use_bytes() const;
  uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  // Frees every buffer not in use.
  void trim();

 private:
  explicit BufferPool(Options options) : options_(options) {}
  uint8_t* allocate(uint64_t size);
  void deallocate(uint8_t* data, uint64_t size);
  void release(uint8_t* data, uint64_t size);
  void free_unused_locked(uint64_t needed);

  Options options_;
  std::weak_ptr<BufferPool> self_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::map<uint64_t, std::vector<uint8_t*>> free_;           // by size class
  std::map<uint8_t*, std::shared_ptr<void>> pinned_owners_;  // keeps pinned allocations alive
  uint64_t allocated_ = 0;
  uint64_t peak_ = 0;
  uint64_t in_use_ = 0;
};

}  // namespace distckpt::io
