// XXH3-64 checksums: fast enough to run on every byte written and read
// (several GB/s per core), and stable across platforms and xxHash releases.
#include "io/checksum.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <new>

#include "distckpt/core/errors.h"

namespace distckpt::io {
namespace {

constexpr bool kLittleEndianHost = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

XXH3_state_t* as_state(void* state) { return static_cast<XXH3_state_t*>(state); }

}  // namespace

uint64_t xxh3(const void* data, size_t n) { return XXH3_64bits(data, n); }

std::vector<uint64_t> block_checksums(const void* data, size_t n, uint64_t block_size) {
  if (block_size == 0) throw UsageError("block_checksums: the checksum block size must be positive");
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::vector<uint64_t> sums;
  sums.reserve(static_cast<size_t>(n / block_size + (n % block_size != 0)));
  for (uint64_t start = 0; start < n; start += block_size) {
    const uint64_t len = std::min<uint64_t>(block_size, n - start);
    sums.push_back(XXH3_64bits(bytes + start, static_cast<size_t>(len)));
  }
  return sums;
}

uint64_t combine_block_checksums(const std::vector<uint64_t>& blocks) {
  // Defined over the little-endian bytes so the value is the same on every host.
  if constexpr (kLittleEndianHost) {
    return XXH3_64bits(blocks.data(), blocks.size() * sizeof(uint64_t));
  } else {
    std::vector<unsigned char> bytes;
    bytes.reserve(blocks.size() * sizeof(uint64_t));
    for (const uint64_t v : blocks) {
      for (int shift = 0; shift < 64; shift += 8) bytes.push_back(static_cast<unsigned char>(v >> shift));
    }
    return XXH3_64bits(bytes.data(), bytes.size());
  }
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

StreamingHash::StreamingHash() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(as_state(state_));
}

StreamingHash::~StreamingHash() { XXH3_freeState(as_state(state_)); }

void StreamingHash::update(const void* data, size_t n) {
  if (XXH3_64bits_update(as_state(state_), data, n) != XXH_OK) {
    throw Error("StreamingHash::update: xxHash rejected the input");
  }
}

uint64_t StreamingHash::digest() const { return XXH3_64bits_digest(as_state(state_)); }

}  // namespace distckpt::io
