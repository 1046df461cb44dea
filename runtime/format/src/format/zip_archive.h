// The index of a zip archive whose entries are stored (not compressed), as
// torch.save writes them, read as untrusted input: from the end of central
// directory (zip64 when present) through every central directory entry to
// its local header. Entries' data are not read here; the caller reads each
// range directly into its destination and checks it with zip::Crc32.
//
// Refused, with a CorruptionError starting with the caller's context: no end
// of central directory at the very end of the file, a directory or entry
// outside the file, several disks, encryption, compression, a local header
// that disagrees with its directory entry, entries whose bytes overlap, and
// duplicate names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace distckpt::zip {

struct Entry {
  std::string name;
  uint64_t data_offset = 0;  // the first byte of the stored data in the file
  uint64_t size = 0;
  uint32_t crc32 = 0;  // as the central directory records it
};

// Reads exactly n bytes at `offset` (throws at the end of the source).
using ReadAt = std::function<void(void* data, size_t n, uint64_t offset)>;

class Index {
 public:
  // `context` begins every error ("'model.pt' cannot be read as a torch.save file").
  Index(const ReadAt& read, uint64_t file_size, std::string context);

  const std::vector<Entry>& entries() const { return entries_; }  // in directory order
  const Entry* find(const std::string& name) const;               // nullptr when absent

 private:
  [[noreturn]] void fail(const std::string& problem) const;
  void read_directory(const ReadAt& read, uint64_t file_size);
  void locate_data(const ReadAt& read, uint64_t directory_offset);

  std::string context_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
};

// CRC-32 (ISO-HDLC, the zip and gzip polynomial), fed in pieces.
class Crc32 {
 public:
  void update(const void* data, size_t n);
  uint32_t value() const { return ~state_; }

 private:
  uint32_t state_ = 0xFFFFFFFFu;
};

}  // namespace distckpt::zip
