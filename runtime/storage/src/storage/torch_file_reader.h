// torch.save files: the zip format Python's torch.save writes and torch.load
// reads. A file is one dict: tensors (at any depth, named by their dotted
// path) and plain values (numbers, strings, bools, None, lists and dicts of
// them).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/state_dict.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_reader.h"
#include "format/zip_archive.h"

namespace distckpt::storage {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct TorchFileContents {
  NamedTensors tensors;  // in the file's order
  StateDict common;      // everything else, nested as in the file
};

// An object that starts like a zip archive (what torch.save writes).
bool is_torch_file(const ObjectReader& file);
// A file torch.save wrote in its legacy format (before PyTorch 1.6, or with
// _use_new_zipfile_serialization=False): a bare pickle stream, unread here.
bool is_legacy_torch_file(const ObjectReader& file);
// is_torch_file of the single file `location` names (false for anything else).
bool is_torch_file(const std::string& location);

// A torch.save file opened for reading: its pickle is read and checked at
// once, tensor bytes on demand, straight from the file into their
// destination. Every record read whole is checked against the CRC-32 the
// archive records for it (torch.load does not check it). CheckpointError
// naming the file (and the entry) for anything but a dict of tensors and
// plain values, or for a file that stands for far more than it holds.
class TorchFileReader {
 public:
  // What the pickle's top value may be: a dict (torch.save(state_dict)),
  // one tensor (its name is ""; a PyTorch DCP tensor item), or any value
  // (a DCP bytes item: its plain values are common(), as the dict's are).
  enum class Root { kDict, kTensor, kAny };
  // `file` is the object `location` names (for messages).
  TorchFileReader(std::unique_ptr<ObjectReader> file, std::string location, Root root = Root::kDict);
  // The single file `location` names (a path, or an s3:// URL of one object).
  explicit TorchFileReader(const std::string& location);
  ~TorchFileReader();
  TorchFileReader(const TorchFileReader&) = delete;
  TorchFileReader& operator=(const TorchFileReader&) = delete;

  struct Tensor {
    std::string name;   // dotted path in the file's dicts
    at::Tensor layout;  // on the meta device: dtype, sizes, strides and storage offset, no data
  };
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const StateDict& common() const { return common_; }

  // Tensor i, whole: its storage read (it keeps its strides).
  at::Tensor read(size_t i);
  // Every tensor; views of one storage share it, as in the file.
  NamedTensors read_all();
  // Whether tensor i's elements lie back to back, row-major, in its storage.
  bool contiguous(size_t i) const;
  // A contiguous tensor i in pieces of at most `scratch`'s bytes (a 1-D byte
  // tensor): fn(first element, values), `values` a view of `scratch`. Its
  // whole record is read once and checked after the last piece, so a caller
  // must not publish what it made of the pieces before this returns.
  void read_in_windows(size_t i, const at::Tensor& scratch,
                       const std::function<void(int64_t first, const at::Tensor& values)>& fn);
  // Where contiguous tensor i's bytes lie: the record of its storage and
  // the file offset of its first byte (record nullptr: no elements).
  struct Placement {
    const zip::Entry* record = nullptr;
    uint64_t file_offset = 0;
    uint64_t bytes = 0;
  };
  Placement placement(size_t i) const;
  // CorruptionError unless `data` (all of `record`'s bytes) matches its CRC-32.
  void check_record(const zip::Entry& record, const void* data) const;
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_->size(); }

  // Re-reads every record of the archive (those no tensor uses too) against
  // its CRC-32, one problem line per damaged or unreadable record.
  void verify(VerifyReport& report, const VerifyProgress& progress) const;

 private:
  struct Storage {
    const zip::Entry* record;
    at::ScalarType dtype;
    int64_t numel;
  };

  const Storage* storage_of(size_t i) const;  // nullptr for a tensor without elements
  at::Tensor read_storage(Storage& s);
  // Reads `n` bytes of `record` from `begin` into `data`, adding them to `crc`.
  void read_bytes(const zip::Entry& record, uint64_t begin, uint64_t n, void* data, zip::Crc32* crc) const;
  // Reads `record` from `begin` to its end through a buffer of its own, into
  // `crc` only; `read(n)` after each piece.
  void add_to_crc(const zip::Entry& record, uint64_t begin, zip::Crc32& crc,
                  const std::function<void(uint64_t n)>& read = {}) const;
  void check_crc(const zip::Entry& record, const zip::Crc32& crc) const;
  void clamp_bools(const at::Tensor& t) const;

  std::string path_;
  std::unique_ptr<ObjectReader> file_;
  std::unique_ptr<zip::Index> index_;
  std::vector<Storage> storages_;
  std::vector<Tensor> tensors_;
  std::vector<size_t> tensor_storage_;  // index into storages_, or SIZE_MAX
  StateDict common_;
};

// Re-reads every record of the zip archive `file` (`path` in messages)
// against its CRC-32, its pickle unread; one problem line per damaged or
// unreadable record. CorruptionError for a damaged archive directory.
void verify_zip_records(const ObjectReader& file, const std::string& path, VerifyReport& report,
                        const VerifyProgress& progress);

// Every tensor and the common values (TorchFileReader::read_all).
TorchFileContents read_torch_file(const std::string& path);

// Writes `common` and `tensors` as one dict (storage::TorchFileWriter);
// `path` must not exist and appears only when complete.
void write_torch_file(const std::string& path, const StateDict& common, const NamedTensors& tensors);

}  // namespace distckpt::storage
