// Helpers shared by the FlatBuffers codecs of the format layer (metadata.cpp,
// common_state.cpp): handling untrusted buffers and staying inside the
// FlatBuffers size limit. Private to the format layer.
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt::fb_support {

// FlatBuffers addresses with 32-bit signed offsets: 2 GiB is a hard limit.
constexpr uint64_t kMaxBufferSize = FLATBUFFERS_MAX_BUFFER_SIZE;

// The bytes of a buffer with the first byte 8-byte aligned. FlatBuffers reads
// scalars in place, so a buffer at an odd address (a slice of a larger read)
// is copied once into aligned storage; an aligned one is used as is.
class AlignedBytes {
 public:
  explicit AlignedBytes(std::string_view bytes) : size_(bytes.size()) {
    if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint64_t) == 0) {
      data_ = reinterpret_cast<const uint8_t*>(bytes.data());
    } else {
      copy_.resize((bytes.size() + sizeof(uint64_t) - 1) / sizeof(uint64_t));
      if (!bytes.empty()) std::memcpy(copy_.data(), bytes.data(), bytes.size());
      data_ = reinterpret_cast<const uint8_t*>(copy_.data());
    }
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::vector<uint64_t> copy_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Verifier limits for a buffer of `size` bytes. Every table of a buffer that
// is not aliased occupies at least 4 bytes of its own, so size / 4 tables is
// enough for any genuine buffer (10^7 chunks included) while it keeps the
// verifier's work linear when a crafted buffer points many times at one table.
inline flatbuffers::Verifier::Options verifier_options(size_t size, uint32_t max_depth) {
  flatbuffers::Verifier::Options options;
  options.max_depth = max_depth;
  options.max_tables = static_cast<flatbuffers::uoffset_t>(size / 4 + 16);
  options.check_alignment = true;
  return options;
}

// Bounds what decoding may allocate. Copying a genuine buffer never copies
// more bytes than the buffer holds, because every string, vector and table is
// stored once. A crafted buffer whose offsets all point at one large vector
// would otherwise expand into terabytes, so every copy is charged here.
class ExpansionBudget {
 public:
  ExpansionBudget(size_t buffer_size, const std::string& origin) : left_(buffer_size), origin_(origin) {}
  void charge(uint64_t bytes) {
    if (bytes > left_) {
      throw CorruptionError(
          fmt::format("{}: the buffer refers to the same data many times over (aliased FlatBuffers offsets); "
                      "refusing to expand it — the file is corrupted or crafted",
                      origin_));
    }
    left_ -= bytes;
  }
  void charge_table() { charge(sizeof(flatbuffers::soffset_t)); }
  void charge_string(const flatbuffers::String* s) {
    if (s != nullptr) charge(s->size());
  }
  template <typename T>
  void charge_vector(const flatbuffers::Vector<T>* v) {
    if (v != nullptr) charge(uint64_t{v->size()} * sizeof(T));
  }

  // Copies a vector of scalars (absent = empty). The verifier only checks
  // the alignment of a vector's length prefix, so elements wider than 4
  // bytes are checked here: builders align them (empty vectors excepted),
  // and reading them misaligned would be undefined behaviour.
  template <typename T>
  std::vector<T> copy_vector(const flatbuffers::Vector<T>* v) {
    if (v == nullptr || v->size() == 0) return {};
    if (reinterpret_cast<uintptr_t>(v->data()) % alignof(T) != 0) {
      throw CorruptionError(
          fmt::format("{}: a vector of {}-byte values is misaligned; the file is corrupted", origin_, sizeof(T)));
    }
    charge_vector(v);
    return std::vector<T>(v->begin(), v->end());
  }

 private:
  uint64_t left_;
  const std::string& origin_;
};

// Throws before a builder holding `fbb.GetSize()` bytes would cross the
// FlatBuffers limit by adding about `bytes` more (the builder itself only
// asserts, which release builds compile out).
inline void ensure_room(const flatbuffers::FlatBufferBuilder& fbb, uint64_t bytes, std::string_view what) {
  constexpr uint64_t kSlack = uint64_t{1} << 20;  // table headers, vtables, padding
  if (bytes > kMaxBufferSize || fbb.GetSize() + bytes + kSlack > kMaxBufferSize) {
    throw UsageError(fmt::format("{} does not fit in a FlatBuffers buffer (limit {} bytes, about {} needed)", what,
                                 kMaxBufferSize, uint64_t{fbb.GetSize()} + bytes));
  }
}

// a * b, or nullopt when it overflows.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// Number of elements of a shape with non-negative extents; nullopt when a
// dimension is negative or the product overflows int64. A zero extent makes
// the count 0 whatever the other extents are.
template <typename Iterator>
std::optional<int64_t> checked_numel(Iterator begin, Iterator end) {
  int64_t count = 1;
  bool overflow = false;
  for (auto it = begin; it != end; ++it) {
    const int64_t dim = *it;
    if (dim < 0) return std::nullopt;
    if (dim == 0) return 0;
    overflow = overflow || __builtin_mul_overflow(count, dim, &count);
  }
  if (overflow) return std::nullopt;
  return count;
}

// ceil(n / block) for block > 0.
inline uint64_t ceil_div(uint64_t n, uint64_t block) { return n / block + (n % block != 0); }

}  // namespace distckpt::fb_support
