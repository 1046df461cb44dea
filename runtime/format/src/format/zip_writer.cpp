#include "format/zip_writer.h"

#include <fmt/format.h>

#include "distckpt/core/errors.h"

namespace distckpt::zip {
namespace {

constexpr uint64_t kAlignment = 64;         // torch.save's, so that records can be mapped
constexpr uint64_t kLocalHeaderBytes = 30;  // before the name
constexpr uint32_t kEscaped32 = 0xFFFFFFFFu;
constexpr uint64_t kZip64ExtraBytes = 4 + 16;  // the local header's: size and stored size
constexpr uint16_t kPaddingId = 0x4246;        // "FB", the id torch.save pads with
constexpr uint16_t kUtf8Names = 0x0800;
constexpr uint16_t kVersion = 45;  // 4.5: zip64

void put(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

bool needs_zip64(uint64_t v) { return v >= kEscaped32; }

}  // namespace

Writer::Writer(io::File& file)
    : sink_([&file](uint64_t offset, const void* data, uint64_t n) { file.pwrite_all(data, n, offset); }) {}

Writer::Writer(Sink sink) : sink_(std::move(sink)) {}

void Writer::begin(const std::string& name, uint64_t size, std::optional<uint32_t> crc32) {
  if (open_) end_entry();
  if (name.empty() || name.size() > 0xFFFF) throw UsageError(fmt::format("a zip entry name of {} bytes", name.size()));
  const bool zip64 = needs_zip64(size);
  std::string header;
  put(header, 0x04034b50, 4);
  put(header, kVersion, 2);
  put(header, kUtf8Names, 2);
  put(header, 0, 2);                  // stored
  put(header, 0, 4);                  // time, date
  put(header, crc32.value_or(0), 4);  // unknown: written when the entry ends
  put(header, zip64 ? kEscaped32 : size, 4);
  put(header, zip64 ? kEscaped32 : size, 4);
  put(header, name.size(), 2);
  const uint64_t fixed = kLocalHeaderBytes + name.size() + (zip64 ? kZip64ExtraBytes : 0);
  // Padding of at least one 4-byte extra field header up to the alignment.
  uint64_t padding = (kAlignment - (at_ + fixed) % kAlignment) % kAlignment;
  if (padding < 4) padding += kAlignment;
  put(header, (zip64 ? kZip64ExtraBytes : 0) + padding, 2);
  header += name;
  if (zip64) {
    put(header, 0x0001, 2);
    put(header, 16, 2);
    put(header, size, 8);
    put(header, size, 8);
  }
  put(header, kPaddingId, 2);
  put(header, padding - 4, 2);
  header.append(padding - 4, 'Z');
  sink_(at_, header.data(), header.size());
  entries_.push_back({name, at_, size, 0});
  expected_crc_ = crc32;
  at_ += header.size();
  left_ = size;
  crc_ = Crc32();
  open_ = true;
}

void Writer::write(const void* data, uint64_t n) {
  if (!open_ || n > left_) {
    throw UsageError(fmt::format("{} bytes more than zip entry '{}' holds", n, open_ ? entries_.back().name : ""));
  }
  sink_(at_, data, n);
  crc_.update(data, n);
  at_ += n;
  left_ -= n;
}

void Writer::end_entry() {
  Written& e = entries_.back();
  if (left_ != 0) throw UsageError(fmt::format("zip entry '{}' ended {} bytes short", e.name, left_));
  e.crc32 = crc_.value();
  open_ = false;
  if (expected_crc_) {
    if (*expected_crc_ != e.crc32) {
      throw UsageError(fmt::format("zip entry '{}' changed while it was written (CRC-32 {:08x}, announced {:08x})",
                                   e.name, e.crc32, *expected_crc_));
    }
    return;
  }
  std::string crc;
  put(crc, e.crc32, 4);
  sink_(e.local + 14, crc.data(), crc.size());
}

uint64_t Writer::finish() {
  if (open_) end_entry();
  const uint64_t directory_at = at_;
  std::string d;
  for (const Written& e : entries_) {
    std::string extra;  // zip64: the escaped fields, in the order the format fixes
    if (needs_zip64(e.size)) {
      put(extra, e.size, 8);
      put(extra, e.size, 8);
    }
    if (needs_zip64(e.local)) put(extra, e.local, 8);
    if (!extra.empty()) {
      std::string field;
      put(field, 0x0001, 2);
      put(field, extra.size(), 2);
      extra = field + extra;
    }
    put(d, 0x02014b50, 4);
    put(d, kVersion, 2);
    put(d, kVersion, 2);
    put(d, kUtf8Names, 2);
    put(d, 0, 2);
    put(d, 0, 4);
    put(d, e.crc32, 4);
    put(d, needs_zip64(e.size) ? kEscaped32 : e.size, 4);
    put(d, needs_zip64(e.size) ? kEscaped32 : e.size, 4);
    put(d, e.name.size(), 2);
    put(d, extra.size(), 2);
    put(d, 0, 2);  // comment
    put(d, 0, 2);  // disk
    put(d, 0, 2);  // internal attributes
    put(d, 0, 4);  // external attributes
    put(d, needs_zip64(e.local) ? kEscaped32 : e.local, 4);
    d += e.name + extra;
  }
  const uint64_t count = entries_.size(), bytes = d.size();
  const bool zip64 = count >= 0xFFFF || needs_zip64(bytes) || needs_zip64(directory_at);
  if (zip64) {
    const uint64_t end64_at = directory_at + bytes;
    put(d, 0x06064b50, 4);
    put(d, 44, 8);  // the record's size after this field
    put(d, kVersion, 2);
    put(d, kVersion, 2);
    put(d, 0, 4);
    put(d, 0, 4);
    put(d, count, 8);
    put(d, count, 8);
    put(d, bytes, 8);
    put(d, directory_at, 8);
    put(d, 0x07064b50, 4);
    put(d, 0, 4);
    put(d, end64_at, 8);
    put(d, 1, 4);
  }
  put(d, 0x06054b50, 4);
  put(d, 0, 2);
  put(d, 0, 2);
  put(d, zip64 ? 0xFFFF : count, 2);
  put(d, zip64 ? 0xFFFF : count, 2);
  put(d, zip64 ? kEscaped32 : bytes, 4);
  put(d, zip64 ? kEscaped32 : directory_at, 4);
  put(d, 0, 2);
  sink_(at_, d.data(), d.size());
  at_ += d.size();
  return at_;
}

}  // namespace distckpt::zip
