// Writes a torch.save file that torch.load opens: one dict of plain values
// and tensors, its pickle first, then each tensor's bytes as they come, in
// order (a tensor need not be held whole: memory stays what the caller
// buffers). The file is written beside its destination and appears there
// only at commit(), durable.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/core/state_dict.h"
#include "format/zip_writer.h"
#include "io/file.h"
#include "io/staging.h"

namespace distckpt::storage {

class TorchFileWriter {
 public:
  struct Tensor {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> sizes;
  };

  // `path` must not exist. UsageError for a name given twice (as a tensor or a
  // common value), or a value or dtype torch.save has no form for.
  TorchFileWriter(const std::string& path, const StateDict& common, std::vector<Tensor> tensors);
  ~TorchFileWriter();  // an uncommitted file is removed
  TorchFileWriter(const TorchFileWriter&) = delete;
  TorchFileWriter& operator=(const TorchFileWriter&) = delete;

  const std::vector<Tensor>& tensors() const { return tensors_; }
  uint64_t bytes() const { return bytes_; }  // of every tensor
  // Bytes [offset, offset + n) of tensor `index`: tensors in order, each
  // from its first byte to its last.
  void write(size_t index, uint64_t offset, const void* data, uint64_t n);
  // Makes the file durable, then renames it into place.
  void commit();

 private:
  void begin_up_to(size_t index);
  void discard() noexcept;  // closes and removes the staging file

  io::StagingPaths paths_;
  std::unique_ptr<io::StagingLock> lock_;  // released after discard()
  std::vector<Tensor> tensors_;
  std::vector<uint64_t> sizes_;  // bytes per tensor
  uint64_t bytes_ = 0;
  std::string folder_;  // every record's, as torch.save names it: the file's stem
  io::File file_;
  std::unique_ptr<zip::Writer> zip_;
  size_t next_ = 0;       // the first tensor whose record has not begun
  bool open_ = false;     // a tensor's record is being written:
  size_t current_ = 0;    // this one,
  uint64_t written_ = 0;  // this far
  bool committed_ = false;
};

}  // namespace distckpt::storage
