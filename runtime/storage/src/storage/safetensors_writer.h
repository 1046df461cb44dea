// Writes tensors as Hugging Face safetensors: one file, or shards of at
// most a given size with `model.safetensors.index.json`. The layout is the
// reference writer's (tensors by dtype width, widest first, then by name;
// compact JSON header padded to 8 bytes), so the same tensors always give
// the same bytes. Tensor bytes may come in any order and in pieces (pwrite
// at known offsets): memory stays bounded by what the caller buffers. The
// files appear under `dir` only at commit(), all at once. On an object
// store (`dir` is s3://...), each file is an object written in parts as its
// bytes arrive (best in order: a part is held until it is full), and the
// index is published last.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/storage/backend.h"
#include "format/safetensors.h"
#include "io/file.h"
#include "io/staging.h"

namespace distckpt::storage {

class SafetensorsWriter {
 public:
  // `tensors`: name, dtype, shape (offsets are filled in). `dir` must not
  // exist yet. max_shard_bytes = 0: one file. Takes the target's
  // io::StagingLock, unless `lock_held` (a save, whose claim holds it).
  SafetensorsWriter(const std::string& dir, std::vector<safetensors::Entry> tensors, uint64_t max_shard_bytes,
                    std::map<std::string, std::string> metadata, bool lock_held = false);
  ~SafetensorsWriter();  // an uncommitted write leaves nothing behind
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The tensors in the order they are laid out.
  const std::vector<safetensors::Entry>& tensors() const { return tensors_; }
  // Bytes [offset, offset + n) of tensor `index` (of tensors()).
  void write(size_t index, uint64_t offset, const void* data, uint64_t n);
  // The files as laid out: name, header bytes (from offset 0) and size.
  struct File {
    std::string name;
    std::string header;
    uint64_t size = 0;
  };
  const std::vector<File>& layout() const { return layout_; }
  // Bytes [offset, offset + n) of file `file` (of layout()), past its header.
  void write_file(size_t file, uint64_t offset, const void* data, uint64_t n);
  // On an object store: file `file` is complete now (its object finished,
  // its memory released) rather than at commit. Elsewhere nothing.
  void finish_file(size_t file);
  // Makes every file durable, then renames the staging directory to `dir`
  // (an object store: completes every object, then publishes the index).
  void commit();
  size_t files() const { return store_ ? objects_.size() : files_.size(); }
  uint64_t bytes() const { return bytes_; }

 private:
  // Creates the files with their headers (and the index) in the staging directory.
  void lay_out(std::vector<std::vector<safetensors::Entry>>& shards,
               const std::map<std::string, std::string>& metadata);
  void discard() noexcept;  // closes and removes what was staged

  io::StagingPaths paths_;
  std::unique_ptr<io::StagingLock> lock_;  // released after discard()
  // On an object store: the backend, each file's object and the index.
  std::unique_ptr<Backend> store_;
  std::vector<File> layout_;
  std::vector<std::unique_ptr<ObjectWriter>> objects_;  // null until written, and once finished
  std::vector<bool> finished_;
  ObjectWriter& object(size_t file);  // created, header written, at first use
  std::string index_json_;
  std::vector<safetensors::Entry> tensors_;
  std::vector<size_t> file_of_;  // per tensor
  std::vector<io::File> files_;
  uint64_t bytes_ = 0;
  bool committed_ = false;
};

// The reference writer's order: widest dtype first, then by name.
void sort_for_safetensors(std::vector<safetensors::Entry>& tensors);

}  // namespace distckpt::storage
