#include "format/zip_archive.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "distckpt/core/errors.h"

namespace distckpt::zip {
namespace {

constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kDirectorySignature = 0x02014b50;
constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr uint64_t kEndBytes = 22;
constexpr uint64_t kZip64LocatorBytes = 20;
constexpr uint64_t kZip64EndBytes = 56;
constexpr uint64_t kDirectoryEntryBytes = 46;
constexpr uint64_t kLocalHeaderBytes = 30;
constexpr uint64_t kMaxComment = 0xFFFF;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kEncrypted = 0x0001 | 0x0040;  // traditional, strong

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "zip fields and CRC-32 words are read little-endian");

// Little-endian fields of bytes already read; running past them is the
// caller's error (`fail`), never a read outside the buffer.
class Fields {
 public:
  Fields(const void* data, size_t n, const std::string& context)
      : data_(static_cast<const uint8_t*>(data)), n_(n), context_(context) {}
  uint16_t u16() { return static_cast<uint16_t>(take(2)); }
  uint32_t u32() { return static_cast<uint32_t>(take(4)); }
  uint64_t u64() { return take(8); }
  std::string bytes(size_t n) {
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  size_t left() const { return n_ - pos_; }

 private:
  void need(size_t n) {
    if (n > n_ - pos_) throw CorruptionError(fmt::format("{}: a record ends before its fields", context_));
  }
  uint64_t take(size_t n) {
    need(n);
    uint64_t v = 0;
    std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  const uint8_t* data_;
  size_t n_, pos_ = 0;
  const std::string& context_;
};

// 0xFFFF / 0xFFFFFFFF in a 16- or 32-bit field: the value is in the zip64 record.
constexpr bool escaped(uint64_t v, int bits) { return v == (bits == 16 ? 0xFFFFu : 0xFFFFFFFFu); }

}  // namespace

Index::Index(const ReadAt& read, uint64_t file_size, std::string context) : context_(std::move(context)) {
  read_directory(read, file_size);
}

void Index::fail(const std::string& problem) const { throw CorruptionError(fmt::format("{}: {}", context_, problem)); }

const Entry* Index::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

void Index::read_directory(const ReadAt& read, uint64_t file_size) {
  // The end record sits at the very end, behind a comment of up to 64 KiB.
  const uint64_t tail_bytes = std::min(file_size, kEndBytes + kMaxComment);
  if (tail_bytes < kEndBytes) fail(fmt::format("{} bytes are too few for a zip archive", file_size));
  std::vector<uint8_t> tail(tail_bytes);
  const uint64_t tail_start = file_size - tail_bytes;
  read(tail.data(), tail.size(), tail_start);
  std::optional<uint64_t> end_at;  // within `tail`
  for (uint64_t i = tail_bytes - kEndBytes + 1; i-- > 0;) {
    uint32_t signature;
    uint16_t comment;
    std::memcpy(&signature, &tail[i], 4);
    std::memcpy(&comment, &tail[i + 20], 2);
    if (signature == kEndSignature && i + kEndBytes + comment == tail_bytes) {
      end_at = i;
      break;
    }
  }
  if (!end_at) fail("no end of central directory at the end of the file (truncated, or not a zip archive)");
  Fields end(&tail[*end_at + 4], kEndBytes - 4, context_);
  const uint16_t disk = end.u16(), directory_disk = end.u16();
  uint64_t disk_entries = end.u16(), entries = end.u16();
  uint64_t directory_bytes = end.u32(), directory_offset = end.u32();
  uint64_t directory_limit = tail_start + *end_at;  // the directory ends before this

  bool zip64 = false;
  if (*end_at >= kZip64LocatorBytes) {
    Fields locator(&tail[*end_at - kZip64LocatorBytes], kZip64LocatorBytes, context_);
    zip64 = locator.u32() == kZip64LocatorSignature;
    if (zip64) {
      const uint32_t end64_disk = locator.u32();
      const uint64_t end64_at = locator.u64();
      const uint32_t disks = locator.u32();
      if (end64_disk != 0 || disks > 1) fail("the archive spans several disks");
      const uint64_t locator_at = directory_limit - kZip64LocatorBytes;
      if (end64_at > locator_at || locator_at - end64_at < kZip64EndBytes) {
        fail(fmt::format("the zip64 end record at {} is not before its locator at {}", end64_at, locator_at));
      }
      uint8_t raw[kZip64EndBytes];
      read(raw, sizeof raw, end64_at);
      Fields end64(raw, sizeof raw, context_);
      if (end64.u32() != kZip64EndSignature) fail(fmt::format("no zip64 end record at {}", end64_at));
      end64.u64();  // record size
      end64.u32();  // versions
      if (end64.u32() != 0 || end64.u32() != 0) fail("the archive spans several disks");
      disk_entries = end64.u64();
      entries = end64.u64();
      directory_bytes = end64.u64();
      directory_offset = end64.u64();
      directory_limit = end64_at;
    }
  }
  if (!zip64 && (disk != 0 || directory_disk != 0)) fail("the archive spans several disks");
  if (disk_entries != entries) fail("the archive spans several disks");
  if (directory_offset > directory_limit || directory_limit - directory_offset < directory_bytes) {
    fail(fmt::format("the central directory ({} bytes at {}) passes its end record at {}", directory_bytes,
                     directory_offset, directory_limit));
  }
  if (entries > directory_bytes / kDirectoryEntryBytes) {
    fail(fmt::format("{} entries cannot fit a central directory of {} bytes", entries, directory_bytes));
  }
  // Bounded by the file's own size (checked above), which a sparse file does
  // not bound in memory: 512 MiB holds the entries of millions of tensors.
  constexpr uint64_t kMaxDirectoryBytes = uint64_t{512} << 20;
  if (directory_bytes > kMaxDirectoryBytes) {
    fail(fmt::format("a central directory of {} bytes, more than the {} distckpt reads", directory_bytes,
                     kMaxDirectoryBytes));
  }
  std::vector<uint8_t> directory(directory_bytes);
  if (!directory.empty()) read(directory.data(), directory.size(), directory_offset);
  Fields d(directory.data(), directory.size(), context_);
  entries_.reserve(entries);
  std::vector<uint64_t> local_offsets;
  local_offsets.reserve(entries);
  for (uint64_t e = 0; e < entries; ++e) {
    if (d.u32() != kDirectorySignature) fail(fmt::format("central directory entry {} has no signature", e));
    d.u16();  // version made by
    d.u16();  // version needed
    const uint16_t flags = d.u16(), method = d.u16();
    d.u32();  // time, date
    Entry entry;
    entry.crc32 = d.u32();
    uint64_t stored = d.u32(), size = d.u32();
    const uint16_t name_bytes = d.u16(), extra_bytes = d.u16(), comment_bytes = d.u16();
    uint64_t start_disk = d.u16();
    d.u16();  // internal attributes
    d.u32();  // external attributes
    uint64_t local = d.u32();
    entry.name = d.bytes(name_bytes);
    const std::string extra = d.bytes(extra_bytes);
    d.bytes(comment_bytes);
    const std::string quoted = fmt::format("entry '{}'", entry.name);
    // zip64: the escaped fields, in this order, in extra field 0x0001.
    Fields x(extra.data(), extra.size(), context_);
    while (x.left() >= 4) {
      const uint16_t id = x.u16(), bytes = x.u16();
      const std::string field = x.bytes(bytes);
      if (id != kZip64ExtraId) continue;
      Fields z(field.data(), field.size(), context_);
      if (escaped(size, 32)) size = z.u64();
      if (escaped(stored, 32)) stored = z.u64();
      if (escaped(local, 32)) local = z.u64();
      if (escaped(start_disk, 16)) start_disk = z.u32();
    }
    if (entry.name.empty()) fail(fmt::format("central directory entry {} has no name", e));
    if (start_disk != 0) fail(quoted + " is on another disk");
    if (flags & kEncrypted) fail(quoted + " is encrypted");
    if (method != 0)
      fail(fmt::format("{} is compressed (method {}); torch.save stores entries as they are", quoted, method));
    if (stored != size) fail(fmt::format("{} is stored in {} bytes but holds {}", quoted, stored, size));
    if (local > directory_offset || directory_offset - local < kLocalHeaderBytes) {
      fail(fmt::format("{} starts at {}, not before the central directory at {}", quoted, local, directory_offset));
    }
    entry.size = size;
    entry.data_offset = local;  // the local header's offset until locate_data
    if (!by_name_.emplace(entry.name, entries_.size()).second) fail(quoted + " appears twice");
    entries_.push_back(std::move(entry));
  }
  if (d.left() != 0) fail(fmt::format("{} bytes follow the last central directory entry", d.left()));
  locate_data(read, directory_offset);
}

// Each entry's data follows its local header, whose name and extra field may
// differ in length from the directory's (torch.save pads the local extra
// field to align tensor data).
void Index::locate_data(const ReadAt& read, uint64_t directory_offset) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [local header, end of data)
  spans.reserve(entries_.size());
  for (Entry& entry : entries_) {
    const uint64_t local = entry.data_offset;
    uint8_t raw[kLocalHeaderBytes];
    read(raw, sizeof raw, local);
    Fields h(raw, sizeof raw, context_);
    const std::string quoted = fmt::format("entry '{}'", entry.name);
    if (h.u32() != kLocalSignature) fail(fmt::format("{} has no local header at {}", quoted, local));
    h.u16();  // version needed
    const uint16_t flags = h.u16(), method = h.u16();
    h.u32();  // time, date
    h.u32();  // crc (or 0 with a data descriptor)
    h.u32();  // sizes, likewise
    h.u32();
    const uint64_t name_bytes = h.u16(), extra_bytes = h.u16();
    if (method != 0 || (flags & kEncrypted)) fail(quoted + "'s local header disagrees with its directory entry");
    const uint64_t header_end = local + kLocalHeaderBytes;
    if (directory_offset - header_end < name_bytes + extra_bytes ||
        directory_offset - header_end - name_bytes - extra_bytes < entry.size) {
      fail(fmt::format("{} ({} bytes at {}) passes the central directory at {}", quoted, entry.size, local,
                       directory_offset));
    }
    std::string name(name_bytes, '\0');
    read(name.data(), name.size(), header_end);
    if (name != entry.name) fail(fmt::format("{}'s local header names '{}'", quoted, name));
    entry.data_offset = header_end + name_bytes + extra_bytes;
    spans.emplace_back(local, entry.data_offset + entry.size);
  }
  // Two entries over the same bytes would let a small file stand for any
  // amount of data.
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      fail(fmt::format("two entries overlap at byte {}", spans[i].first));
    }
  }
}

}  // namespace distckpt::zip
