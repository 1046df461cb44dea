#include "storage/safetensors_writer.h"

#include <fmt/format.h>

#include <algorithm>

#include "distckpt/core/errors.h"
#include "format/dtype.h"

namespace distckpt::storage {
namespace {

// Position in the reference implementation's dtype order, which the writer
// sorts by (descending): wider types first keep every tensor aligned.
// By name, so types this LibTorch lacks need no special case.
int dtype_rank(at::ScalarType dtype) {
  constexpr const char* kOrder[] = {"bool",    "uint8",     "int8",    "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu",
                                    "int16",   "uint16",    "float16", "bfloat16",    "int32",         "uint32",
                                    "float32", "complex64", "float64", "int64",       "uint64"};
  const std::string name = dtype_name(dtype);
  for (size_t i = 0; i < std::size(kOrder); ++i) {
    if (name == kOrder[i]) return static_cast<int>(i);
  }
  return -1;
}

uint64_t bytes_of(const safetensors::Entry& e) { return static_cast<uint64_t>(numel(e.shape)) * dtype_size(e.dtype); }

}  // namespace

void sort_for_safetensors(std::vector<safetensors::Entry>& tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const safetensors::Entry& a, const safetensors::Entry& b) {
    const int ra = dtype_rank(a.dtype), rb = dtype_rank(b.dtype);
    return ra != rb ? ra > rb : a.name < b.name;
  });
}

SafetensorsWriter::SafetensorsWriter(const std::string& dir, std::vector<safetensors::Entry> tensors,
                                     uint64_t max_shard_bytes, std::map<std::string, std::string> metadata,
                                     bool lock_held)
    : tensors_(std::move(tensors)) {
  if (is_object_store(dir)) {
    store_ = open_backend(dir);
    paths_.target = dir;
  } else {
    paths_ = io::staging_paths(dir);
  }
  if (store_ ? store_->root_exists() : !io::holds_nothing(paths_.target)) {  // a dangling link too
    throw CheckpointError(
        fmt::format("'{}' already exists; remove it or choose another destination (nothing was written)",
                    paths_.target),
        paths_.target);
  }
  sort_for_safetensors(tensors_);
  // Shards in order, each up to max_shard_bytes of tensor data (a larger
  // tensor gets a shard of its own), like the Hugging Face exporters.
  std::vector<std::vector<safetensors::Entry>> shards(1);
  uint64_t in_shard = 0;
  for (const safetensors::Entry& e : tensors_) {
    const uint64_t n = bytes_of(e);
    if (max_shard_bytes > 0 && in_shard > 0 && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(e);
    in_shard += n;
    bytes_ += n;
  }
  if (!store_) {
    if (!lock_held) {
      io::make_dirs(paths_.parent);  // as the staging directory below always did
      lock_ = std::make_unique<io::StagingLock>(paths_);
    }
    io::remove_tree(paths_.staging);  // left by a crashed earlier run
    io::make_dirs(paths_.staging);
  }
  try {
    lay_out(shards, metadata);
  } catch (...) {
    discard();  // a failed export leaves nothing behind
    throw;
  }
}

void SafetensorsWriter::lay_out(std::vector<std::vector<safetensors::Entry>>& shards,
                                const std::map<std::string, std::string>& metadata) {
  safetensors::Index index;
  index.metadata["total_size"] = std::to_string(bytes_);
  tensors_.clear();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1
                                 ? "model.safetensors"
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    const std::string header = safetensors::encode_header(shards[s], metadata);
    const uint64_t size = shards[s].empty() ? header.size() : shards[s].back().end;
    layout_.push_back({name, header, size});
    if (store_) {
      objects_.emplace_back();  // created at its first write: only the files being written hold parts
    } else {
      io::File& f = files_.emplace_back(paths_.staging + "/" + name, io::File::Mode::kCreateTruncate);
      f.pwrite_all(header.data(), header.size(), 0);
      // Full size now: other ranks writing into the staging files read their
      // layout from the headers, and a header's offsets must fit its file.
      f.resize(size);
    }
    for (safetensors::Entry& e : shards[s]) {
      index.weight_map[e.name] = name;
      tensors_.push_back(std::move(e));
      file_of_.push_back(s);
    }
  }
  if (shards.size() <= 1) return;
  if (store_) {
    index_json_ = safetensors::encode_index(index);  // published last, at commit
  } else {
    io::write_file_atomic(paths_.staging + "/model.safetensors.index.json", safetensors::encode_index(index));
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!committed_) discard();
}

void SafetensorsWriter::discard() noexcept {
  files_.clear();
  if (store_) {
    try {
      for (const std::unique_ptr<ObjectWriter>& o : objects_) {
        if (o) o->abort();
      }
      for (const File& f : layout_) store_->remove(f.name);  // those already completed
    } catch (...) {                                          // the original error matters more
    }
    objects_.clear();
    return;
  }
  try {
    io::remove_tree(paths_.staging);
  } catch (...) {  // the staging name is reused, and cleared, next time
  }
}

void SafetensorsWriter::write(size_t index, uint64_t offset, const void* data, uint64_t n) {
  const safetensors::Entry& e = tensors_.at(index);
  if (offset > e.end - e.begin || n > e.end - e.begin - offset) {
    throw UsageError(
        fmt::format("write of {} bytes at {} is outside tensor '{}' ({} bytes)", n, offset, e.name, e.end - e.begin));
  }
  if (store_) {
    object(file_of_[index]).write(e.begin + offset, static_cast<const uint8_t*>(data), n);
  } else {
    files_[file_of_[index]].pwrite_all(data, n, e.begin + offset);
  }
}

ObjectWriter& SafetensorsWriter::object(size_t file) {
  if (finished_.size() <= file) finished_.resize(layout_.size(), false);
  if (finished_[file]) {
    throw UsageError(fmt::format("'{}' was written after it was finished", layout_[file].name));
  }
  std::unique_ptr<ObjectWriter>& o = objects_.at(file);
  if (!o) {
    o = store_->create(layout_[file].name, layout_[file].size);
    o->write(0, reinterpret_cast<const uint8_t*>(layout_[file].header.data()), layout_[file].header.size());
  }
  return *o;
}

void SafetensorsWriter::finish_file(size_t file) {
  if (!store_) return;  // the files are made durable at commit
  if (finished_.size() <= file) finished_.resize(layout_.size(), false);
  if (finished_[file]) return;
  object(file).finish(layout_[file].size);
  objects_[file].reset();
  finished_[file] = true;
}

void SafetensorsWriter::write_file(size_t file, uint64_t offset, const void* data, uint64_t n) {
  const File& f = layout_.at(file);
  if (offset < f.header.size() || offset > f.size || n > f.size - offset) {
    throw UsageError(
        fmt::format("write of {} bytes at {} is outside the tensors of '{}' ({} bytes)", n, offset, f.name, f.size));
  }
  if (store_) {
    object(file).write(offset, static_cast<const uint8_t*>(data), n);
  } else {
    files_[file].pwrite_all(data, n, offset);
  }
}

void SafetensorsWriter::commit() {
  if (store_) {
    for (size_t f = 0; f < objects_.size(); ++f) finish_file(f);
    if (!index_json_.empty() && !store_->publish("model.safetensors.index.json", index_json_, /*if_absent=*/true)) {
      throw CheckpointError(
          fmt::format("another save wrote '{}' while this one was writing; give each save its own "
                      "prefix",
                      store_->describe("model.safetensors.index.json")));
    }
    committed_ = true;
    return;
  }
  for (io::File& f : files_) {
    f.sync();
    f.close();
  }
  io::fsync_dir(paths_.staging);
  io::rename_into_empty(paths_.staging, paths_.target);
  io::fsync_dir(paths_.parent);
  committed_ = true;
}

}  // namespace distckpt::storage
