// A POSIX shared-memory region (shm_open + mmap) that one process creates
// and others on the same host map read-only: how ranks on one host hand each
// other the stored bytes one of them read (load/host_exchange.h).
//
// The name is random and created exclusively (mode 0600), so two jobs never
// meet in one region. The creator unlinks the name as soon as the others have
// mapped it; until then the name is visible under /dev/shm as
// "distckpt-<pid>-<random>". A process killed in between leaves its name
// behind; create() removes such names once their process is gone and they
// are ten minutes old.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace distckpt::io {

class SharedRegion {
 public:
  SharedRegion() = default;
  ~SharedRegion();
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  // A new region of `bytes` (> 0), mapped read-write. Throws IoError naming
  // the cause (no /dev/shm, out of space) and what to do.
  static SharedRegion create(uint64_t bytes);
  // Another process's region, read-only; it must hold at least `bytes`.
  // Throws ProtocolError if `name` is not a name create() makes or the region
  // is smaller (both come from a peer's offer), IoError if it cannot be opened.
  static SharedRegion open_read_only(const std::string& name, uint64_t bytes);

  // Whether `name` has the form create() gives names ("/distckpt-<digits>-<hex>").
  static bool is_region_name(const std::string& name);

  // Removes the name (the mappings stay valid); the creator's destructor does it otherwise.
  void unlink();

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  void reset();

  std::string name_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool owner_ = false;  // created here and not yet unlinked
};

// A 32-bit counter inside a region (4-byte aligned), raised by one process
// and awaited by others: a release store and a futex wake on the shared page,
// an acquire load, and a futex wait that sleeps rather than spins.
uint32_t read_counter(const uint8_t* at);
void raise_counter(uint8_t* at, uint32_t value);
// Sleeps until the counter differs from `seen` or `slice` passed; returns its value.
uint32_t wait_counter_change(const uint8_t* at, uint32_t seen, std::chrono::milliseconds slice);

}  // namespace distckpt::io
