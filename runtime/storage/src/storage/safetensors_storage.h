// Hugging Face safetensors as a StorageReader: one file, or a directory of
// shards listed by a `*.safetensors.index.json`. Each tensor is one stored
// chunk covering its whole shape, row-major at a known offset, so the read
// engine reads exactly the byte ranges a rank's shards overlap. The format
// records no checksums: reads are as trustworthy as the disk.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_reader.h"
#include "storage/file_ranges.h"

namespace distckpt::storage {

class SafetensorsStorage final : public FileBackedStorage {
 public:
  // `file`: one .safetensors object of `backend`; "" for the backend's root
  // holding one index (and its shards) or exactly one .safetensors file.
  // CheckpointError when it holds neither; CorruptionError (naming the file
  // and tensor) for a damaged header or index.
  SafetensorsStorage(std::shared_ptr<Backend> backend, const std::string& file);

  StorageFormat format() const override { return StorageFormat::safetensors(); }
  const std::string& location() const override { return location_; }
  const StorageIndex& index() const override { return index_; }
  // The string pairs of "__metadata__" are common values, but "format" (the
  // framework the files are for, "pt" from PyTorch) describes the files,
  // not the state: it is their content metadata, as Hugging Face's readers
  // treat it (a state dict loaded from the files has no "format" key).
  Value read_common_state() const override { return common_; }
  std::optional<Value> read_content_metadata() const override;
  void verify(VerifyReport& report, const VerifyProgress& progress) override;

  // The index file this storage was opened through ("" for one file).
  const std::string& index_file() const { return index_file_; }

 private:
  void add_file(const std::string& name, const std::vector<std::string>* expected);

  std::shared_ptr<Backend> backend_;
  std::string location_;
  std::string index_file_;
  StorageIndex index_;
  Value common_ = Value::dict();
  Value content_ = Value::dict();
};

// Whether the backend's root looks like safetensors (an index, or .safetensors files).
bool holds_safetensors(Backend& backend);
// Whether `path` is named like a safetensors file ("*.safetensors").
bool is_safetensors_name(const std::string& path);

}  // namespace distckpt::storage
