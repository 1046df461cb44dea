// Chunk checksums. Each chunk is cut into fixed-size blocks with one XXH3-64
// per block, so a load that reads only part of a chunk still verifies every
// byte it uses; the chunk checksum is the XXH3-64 of its block checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace distckpt::io {

constexpr uint64_t kDefaultChecksumBlock = uint64_t{1} << 20;  // 1 MiB

uint64_t xxh3(const void* data, size_t n);
std::vector<uint64_t> block_checksums(const void* data, size_t n, uint64_t block_size);
uint64_t combine_block_checksums(const std::vector<uint64_t>& blocks);
std::string hex64(uint64_t v);  // 16 lowercase hex digits

// Streaming XXH3-64 (for digests over logical tensors).
class StreamingHash {
 public:
  StreamingHash();
  ~StreamingHash();
  StreamingHash(const StreamingHash&) = delete;
  StreamingHash& operator=(const StreamingHash&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  void* state_;
};

}  // namespace distckpt::io
