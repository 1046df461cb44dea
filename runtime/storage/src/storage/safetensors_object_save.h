// A safetensors save by several ranks into an object store. The ranks of a
// directory save write their pieces into the shared files; an object takes
// bytes from one writer only, so here:
//
//   coordinator  prepare: lays the files out (SafetensorsWriter, headers
//                written) and publishes each file's layout for the ranks
//   every rank   write: its pieces' row runs, in order, into one object of
//                its own; returns where each run belongs
//   coordinator  commit: assembles each file window by window (fetching
//                each rank's runs with one ranged GET per rank and window),
//                completes the files, publishes the index, removes the rest
//
// Every byte passes through the coordinator once more than in a directory;
// its memory is two windows of 16 MiB and the parts of the one file being
// assembled (its object is created at its first window and finished after
// its last), whatever the model's size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distckpt/storage/backend.h"
#include "format/safetensors.h"
#include "storage/safetensors_writer.h"

namespace distckpt::storage {

// Coordinator, after the writer laid the files out.
void publish_safetensors_layout(Backend& backend, const SafetensorsWriter& writer);

// What a rank needs to know of the layout: where each tensor's bytes go.
struct SafetensorsLayout {
  struct Place {
    size_t file = 0;     // index into the coordinator's layout()
    uint64_t begin = 0;  // the tensor's first byte in that file
  };
  std::unordered_map<std::string, Place> tensors;
};
SafetensorsLayout read_safetensors_layout(Backend& backend);

// One rank's runs, written in order into an object of its own.
class SafetensorsRuns {
 public:
  explicit SafetensorsRuns(Backend& backend);
  ~SafetensorsRuns();  // unfinished: the object is aborted
  void add(size_t file, uint64_t offset, const uint8_t* data, uint64_t n);
  // Completes the object; the result commit() takes from this rank.
  std::string finish();

 private:
  Backend& backend_;
  std::string name_;
  std::unique_ptr<ObjectWriter> object_;
  uint64_t written_ = 0;
  std::string runs_;  // (file, offset, length) as little-endian u64s
};

// Coordinator: every rank's runs into the writer's files, then its commit.
void assemble_safetensors(Backend& backend, SafetensorsWriter& writer, const std::vector<std::string>& results);

// Removes the layout and the ranks' objects. Never throws.
void remove_safetensors_staging(Backend& backend) noexcept;

}  // namespace distckpt::storage
