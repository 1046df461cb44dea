// Writes a zip archive of stored entries, one after another, as torch.save
// lays them out: each entry's data aligned to 64 bytes (padding in the local
// header's extra field), its CRC-32 computed as the bytes pass and written
// into the local header when the entry ends (or, when the caller knows it,
// written with the header, so that every byte goes out in order: an object
// store's multipart upload), zip64 records only where a size, an offset or
// the entry count needs them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "format/zip_archive.h"
#include "io/file.h"

namespace distckpt::zip {

class Writer {
 public:
  // Puts `n` bytes at `offset` of the archive.
  using Sink = std::function<void(uint64_t offset, const void* data, uint64_t n)>;
  explicit Writer(io::File& file);  // written from offset 0
  explicit Writer(Sink sink);

  // Starts entry `name` of exactly `size` bytes; the previous one must be
  // complete. With `crc32` (of the bytes to come), nothing is written twice.
  void begin(const std::string& name, uint64_t size, std::optional<uint32_t> crc32 = std::nullopt);
  // The entry's next bytes, in order.
  void write(const void* data, uint64_t n);
  // Ends the last entry and writes the central directory; returns the archive's size.
  uint64_t finish();

 private:
  struct Written {
    std::string name;
    uint64_t local = 0;  // the local header's offset
    uint64_t size = 0;
    uint32_t crc32 = 0;
  };
  void end_entry();

  Sink sink_;
  uint64_t at_ = 0;  // bytes written
  std::vector<Written> entries_;
  uint64_t left_ = 0;  // bytes the open entry still expects
  Crc32 crc_;
  bool open_ = false;
  std::optional<uint32_t> expected_crc_;  // the open entry's, when given at begin()
};

}  // namespace distckpt::zip
