// Where a FileWriteJob puts its bytes: a local file, or (through an adapter
// of the storage layer) an object of any backend. Every byte of [0, size)
// is written once, from several threads, then finish() makes it durable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace distckpt::io {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write_at(uint64_t offset, const uint8_t* data, uint64_t n) = 0;
  virtual void finish(uint64_t size) = 0;        // durable (and visible) when it returns
  virtual void abort() noexcept = 0;             // an unfinished sink's bytes are dropped (or left to the caller)
  virtual bool direct() const { return false; }  // written with O_DIRECT
};

// `path`, created or truncated; O_DIRECT when `try_direct` and the file
// system allows it; fsync'ed and closed by finish(). abort() leaves the file
// (its directory is the caller's to clean).
std::unique_ptr<ByteSink> file_sink(const std::string& path, bool try_direct);

}  // namespace distckpt::io
