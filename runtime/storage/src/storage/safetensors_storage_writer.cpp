// A save straight into Hugging Face safetensors, written by every rank at
// once. The coordinator lays the files out (SafetensorsWriter: same order,
// header and shards as the export) at their full size in the staging
// directory; each rank then reads that layout back from the headers and
// pwrites its pieces, row run by row run, at their places in the
// consolidated tensors. No rank holds more than its own pieces. On an
// object store the ranks write their runs into objects of their own, which
// the coordinator assembles (storage/safetensors_object_save.h).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "distckpt/storage/safetensors.h"
#include "distckpt/storage/storage_writer.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "io/file.h"
#include "io/staging.h"
#include "storage/directory_commit.h"
#include "storage/posix_backend.h"
#include "storage/safetensors_object_save.h"
#include "storage/safetensors_storage.h"
#include "storage/safetensors_writer.h"

namespace distckpt {
namespace {

// Where the elements of a key's tensor go: an external tensor covering
// `region` of it (the whole tensor without a mapping).
struct Target {
  std::string name;
  Box region;
};

// Row-major element offset of `index` (absolute) inside `box`.
int64_t offset_in(const Box& box, const Shape& index) {
  int64_t offset = 0;
  for (size_t d = 0; d < box.ndim(); ++d) offset = offset * box.length[d] + (index[d] - box.offset[d]);
  return offset;
}

// Calls `run(src, dst, n)` (element offsets in `from`'s and `to`'s row-major
// orders) for every contiguous run of `cut`, which lies in both boxes.
// Trailing dims that `cut`, `from` and `to` all cover fully merge into one
// run, so a row-sharded piece is a single run.
template <typename Run>
void for_each_run(const Box& cut, const Box& from, const Box& to, const Run& run) {
  const size_t ndim = cut.ndim();
  if (cut.empty()) return;
  if (ndim == 0) return run(0, 0, 1);
  size_t inner = ndim - 1;  // the run spans dims inner..ndim-1
  int64_t length = cut.length[inner];
  while (inner > 0 && cut.length[inner] == from.length[inner] && cut.length[inner] == to.length[inner]) {
    --inner;
    length *= cut.length[inner];
  }
  Shape index = cut.offset;
  while (true) {
    run(offset_in(from, index), offset_in(to, index), length);
    size_t d = inner;  // odometer over the dims before `inner`
    while (d > 0) {
      --d;
      if (++index[d] < cut.offset[d] + cut.length[d]) break;
      index[d] = cut.offset[d];
      if (d == 0) return;
    }
    if (inner == 0) return;
  }
}

class SafetensorsStorageWriter final : public StorageWriter {
 public:
  SafetensorsStorageWriter(const std::string& dir, SafetensorsWriteOptions options) : options_(std::move(options)) {
    if (is_object_store(dir)) {
      store_ = open_backend(dir);
      paths_.target = dir;
    } else {
      paths_ = io::staging_paths(dir);
    }
  }

  StorageFormat format() const override { return StorageFormat::safetensors(); }
  const std::string& location() const override { return paths_.target; }

  void claim() override {
    // Held until commit or discard: a second save of this process (or, in a
    // directory, of another) into the same target fails here, and never
    // shares or removes this one's staging.
    claim_ = std::make_unique<storage::InFlightClaim>(paths_, /*lock_directory=*/!store_);
    if (store_ ? store_->root_exists() : io::exists(paths_.target)) {
      throw CheckpointError(
          fmt::format("'{}' already exists; a safetensors save never replaces files: remove it or save into another "
                      "directory (nothing was written)",
                      paths_.target),
          paths_.target);
    }
  }

  void prepare(const SaveContents& contents) override {
    if (!contents.objects.empty() && options_.mapping) {
      log_message(LogLevel::kWarning, fmt::format("{} sharded objects are not written to '{}' under name mapping '{}'",
                                                  contents.objects.size(), paths_.target, options_.mapping->name()));
    } else if (!contents.objects.empty()) {
      throw UsageError(fmt::format(
          "sharded object '{}' cannot be saved as safetensors, which holds tensors only; save it with the distckpt "
          "format (SaveOptions::format)",
          contents.objects.front()));
    }
    writer_ = std::make_unique<storage::SafetensorsWriter>(paths_.target, entries_for(contents.tensors),
                                                           options_.max_shard_bytes, metadata_of(contents.common),
                                                           /*lock_held=*/true);  // by the save's claim
    if (store_) storage::publish_safetensors_layout(*store_, *writer_);
  }

  std::string write(int /*rank*/, std::vector<SavePiece> pieces) override {
    if (pieces.empty()) return {};
    // Where each tensor's bytes go, and how they get there: into the shared
    // files of the staging directory, or (an object store) into this rank's
    // own object of runs, which the coordinator assembles.
    std::function<std::pair<size_t, uint64_t>(const std::string&)> locate;
    std::function<void(size_t, uint64_t, const uint8_t*, uint64_t)> put;
    std::optional<storage::SafetensorsLayout> placed;
    std::optional<storage::SafetensorsRuns> runs;
    std::unique_ptr<storage::SafetensorsStorage> layout;
    std::vector<io::File> files;                 // by index, opened once
    std::map<std::string, size_t> file_numbers;  // by relative path
    if (store_) {
      placed = storage::read_safetensors_layout(*store_);
      runs.emplace(*store_);
      locate = [&](const std::string& name) -> std::pair<size_t, uint64_t> {
        const auto it = placed->tensors.find(name);
        if (it == placed->tensors.end()) {
          throw UsageError(fmt::format("'{}' is missing from the staged safetensors layout", name));
        }
        return {it->second.file, it->second.begin};
      };
      put = [&](size_t file, uint64_t offset, const uint8_t* data, uint64_t n) { runs->add(file, offset, data, n); };
    } else {
      layout = std::make_unique<storage::SafetensorsStorage>(std::make_shared<storage::PosixBackend>(paths_.staging),
                                                             "");  // the coordinator's headers
      locate = [&](const std::string& name) -> std::pair<size_t, uint64_t> {
        const TensorRecord* record = layout->index().find_tensor(name);
        if (!record) throw UsageError(fmt::format("'{}' is missing from the staged safetensors files", name));
        const ChunkRecord& chunk = record->chunks.at(0);
        const std::string& path = layout->index().files.at(chunk.file).path;
        const auto [it, added] = file_numbers.emplace(path, files.size());
        if (added) files.emplace_back(io::safe_join(paths_.staging, path), io::File::Mode::kUpdate);
        return {it->second, chunk.byte_offset};
      };
      put = [&](size_t file, uint64_t offset, const uint8_t* data, uint64_t n) {
        files[file].pwrite_all(data, n, offset);
      };
    }
    std::unordered_map<std::string, std::vector<Target>> routes;
    if (options_.mapping) {
      for (const MappedName& n : options_.mapping->expand()) routes[n.key].push_back({n.external, n.region});
    }
    for (const SavePiece& piece : pieces) {
      if (piece.object) {
        if (options_.mapping) continue;  // not written (warned at prepare)
        throw UsageError("a safetensors save was handed a sharded object");
      }
      const at::Tensor host = piece.data.device().is_cpu() ? piece.data : piece.data.cpu();
      const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
      const uint64_t element = host.element_size();
      const std::vector<Target> itself{{piece.key, Box{Shape(piece.global_shape.size(), 0), piece.global_shape}}};
      const std::vector<Target>& targets = options_.mapping ? routes[piece.key] : itself;
      // A flat slice is a few boxes, each contiguous in the slice.
      std::vector<FlatPiece> units;
      if (piece.flat) {
        units = decompose_flat_range(piece.box, *piece.flat);
        for (FlatPiece& u : units) u.flat_start -= piece.flat->start;
      } else {
        units.push_back({piece.box, 0});
      }
      for (const Target& target : targets) {
        const auto [file, byte_offset] = locate(target.name);
        for (const FlatPiece& unit : units) {
          const std::optional<Box> cut = intersect(unit.box, target.region);
          if (!cut) continue;
          for_each_run(*cut, unit.box, target.region,
                       [&, f = file, at = byte_offset](int64_t src, int64_t dst, int64_t n) {
                         put(f, at + dst * element, bytes + (unit.flat_start + src) * element, n * element);
                       });
        }
      }
    }
    if (runs) return runs->finish();
    for (io::File& file : files) {
      file.sync();  // this rank's writes durable on a shared file system too
      file.close();
    }
    return {};
  }

  void commit(const std::vector<std::string>& written) override {
    if (!writer_) throw UsageError("a safetensors save was committed before it was prepared");
    if (store_) {
      storage::assemble_safetensors(*store_, *writer_, written);
      storage::remove_safetensors_staging(*store_);
    } else {
      writer_->commit();
    }
    writer_.reset();
    claim_.reset();
  }

  void discard() noexcept override {
    writer_.reset();      // removes its staging directory (its objects)
    if (!claim_) return;  // another save's staging is not ours to remove
    if (store_) {
      storage::remove_safetensors_staging(*store_);
    } else {
      try {
        io::remove_tree(paths_.staging);
      } catch (...) {  // the original error matters more
      }
    }
    claim_.reset();
  }

 private:
  // The tensors of the files: the saved ones, or the mapping's external
  // ones (checked against the saved shapes).
  std::vector<safetensors::Entry> entries_for(const std::vector<SaveTensor>& tensors) const {
    std::vector<safetensors::Entry> out;
    if (!options_.mapping) {
      for (const SaveTensor& t : tensors) out.push_back({t.key, t.dtype, t.global_shape, 0, 0});
      return out;
    }
    std::unordered_map<std::string, const SaveTensor*> by_key;
    for (const SaveTensor& t : tensors) by_key[t.key] = &t;
    std::set<std::string> mapped;
    for (MappedName& n : options_.mapping->expand()) {
      const auto t = by_key.find(n.key);
      if (t == by_key.end()) {
        throw UsageError(fmt::format("name mapping '{}' names '{}' (for '{}'), which this save does not hold",
                                     options_.mapping->name(), n.key, n.external));
      }
      const Shape& shape = t->second->global_shape;
      if (n.key_pad_dim >= 0 && shape.size() == n.key_shape.size()) {
        n.take_pad_extent(shape[static_cast<size_t>(n.key_pad_dim)]);
      }
      if (shape != n.key_shape) {
        throw UsageError(fmt::format("'{}' has shape {}, but name mapping '{}' expects {} (for '{}')", n.key,
                                     to_string(shape), options_.mapping->name(), to_string(n.key_shape), n.external));
      }
      out.push_back({n.external, t->second->dtype, n.external_shape(), 0, 0});
      mapped.insert(n.key);
    }
    const size_t unmapped = tensors.size() - mapped.size();
    if (unmapped > 0) {
      log_message(LogLevel::kWarning,
                  fmt::format("{} tensors are not written to '{}': name mapping '{}' does not name them", unmapped,
                              paths_.target, options_.mapping->name()));
    }
    return out;
  }

  std::map<std::string, std::string> metadata_of(const StateDict* common) const {
    std::map<std::string, std::string> metadata{{safetensors::kFormatKey, "pt"}};
    if (!common || common->as_dict().empty()) return metadata;
    if (options_.mapping) {  // the external model's tensors only, like the tensors it does not name
      log_message(LogLevel::kWarning, fmt::format("{} common values are not written to '{}' under name mapping '{}'",
                                                  common->as_dict().size(), paths_.target, options_.mapping->name()));
      return metadata;
    }
    for (const auto& [key, value] : common->as_dict()) {
      if (value.kind() != Kind::kString) {
        throw UsageError(fmt::format(
            "common value '{}' ({}) cannot be saved as safetensors, which keeps only strings beside tensors "
            "(\"__metadata__\"): save it as a string or use the distckpt format",
            key, kind_name(value.kind())));
      }
      if (key == safetensors::kFormatKey) {
        throw UsageError("the common value 'format' is reserved in safetensors (\"pt\")");
      }
      metadata[key] = value.as_string();
    }
    return metadata;
  }

  io::StagingPaths paths_;
  std::unique_ptr<Backend> store_;  // an object store's, else none
  std::unique_ptr<storage::InFlightClaim> claim_;
  SafetensorsWriteOptions options_;
  std::unique_ptr<storage::SafetensorsWriter> writer_;  // coordinator, from prepare to commit
};

}  // namespace

std::unique_ptr<StorageWriter> make_safetensors_writer(const std::string& dir, SafetensorsWriteOptions options) {
  return std::make_unique<SafetensorsStorageWriter>(dir, std::move(options));
}

}  // namespace distckpt
