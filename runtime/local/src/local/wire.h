// Little-endian length-prefixed encoding of the small messages the local
// checkpoint layer sends (announcements, inventories). Readers treat the
// bytes as untrusted: every read is bounds-checked and counts are capped by
// what the remaining bytes can hold.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "distckpt/core/errors.h"

namespace distckpt::local {

class WireWriter {
 public:
  void u64(uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void str(std::string_view s) {
    u64(s.size());
    out_.append(s.data(), s.size());
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class WireReader {
 public:
  WireReader(std::string_view bytes, std::string origin) : bytes_(bytes), origin_(std::move(origin)) {}
  uint64_t u64() {
    need(sizeof(uint64_t));
    uint64_t v;
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string str() {
    const uint64_t n = u64();
    need(n);
    std::string s(bytes_.substr(at_, n));
    at_ += n;
    return s;
  }
  // A count of items that take at least `min_item_bytes` each.
  uint64_t count(uint64_t min_item_bytes) {
    const uint64_t n = u64();
    if (min_item_bytes > 0 && n > (bytes_.size() - at_) / min_item_bytes) fail();
    return n;
  }

 private:
  void need(uint64_t n) {
    if (n > bytes_.size() - at_) fail();
  }
  [[noreturn]] void fail() const { throw CommError(fmt::format("{} is malformed (truncated)", origin_)); }

  std::string_view bytes_;
  size_t at_ = 0;
  std::string origin_;
};

}  // namespace distckpt::local
