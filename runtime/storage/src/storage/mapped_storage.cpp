// A checkpoint in another framework's naming seen under checkpoint keys
// (map_storage in storage_reader.h). Each external tensor becomes one stored
// chunk (or, when it is itself chunked, several) of the key's tensor, at its
// place in the stack or the fused tensor: the planner and the read engine
// then read exactly the byte ranges a rank's shards overlap, as they do for
// any stored chunk, and no tensor is ever assembled whole.
#include <fmt/format.h>

#include <map>
#include <utility>

#include "distckpt/core/errors.h"
#include "distckpt/storage/storage_reader.h"
#include "format/dtype.h"

namespace distckpt {
namespace {

std::string place_of(const MappedName& name) {
  return fmt::format("'{}' at offset {} of its tensor", name.key, to_string(name.region.offset));
}

class MappedStorage final : public StorageReader {
 public:
  MappedStorage(std::unique_ptr<StorageReader> external, const NameMapping& mapping) : external_(std::move(external)) {
    const StorageIndex& outside = external_->index();
    index_.files = outside.files;
    index_.checksum_block_size = outside.checksum_block_size;
    std::map<std::string, Building> by_key;
    for (MappedName& name : mapping.expand()) add(outside, mapping, std::move(name), by_key);
    index_.tensors.reserve(by_key.size());
    sources_.reserve(by_key.size());
    for (auto& [key, building] : by_key) {  // std::map: sorted by key, as StorageIndex requires
      index_.tensors.push_back(std::move(building.record));
      sources_.push_back(std::move(building.sources));
    }
  }

  StorageFormat format() const override { return external_->format(); }
  const std::string& location() const override { return external_->location(); }
  const StorageIndex& index() const override { return index_; }

  void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) override {
    const Source& source = source_of(tensor, chunk);
    external_->read_chunk(*source.record, source.chunk, begin, end, out);
  }
  void read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) override {
    const Source& source = source_of(tensor, chunk);
    external_->read_chunk_runs(*source.record, source.chunk, runs);
  }
  std::string read_object(const ObjectRecord& object) override {
    throw UsageError(fmt::format("object '{}' is not in the mapped index of '{}'", object.key, location()));
  }
  Value read_common_state() const override { return external_->read_common_state(); }
  std::optional<Value> read_content_metadata() const override { return external_->read_content_metadata(); }
  void verify(VerifyReport& report, const VerifyProgress& progress) override { external_->verify(report, progress); }
  uint64_t bytes_read() const override { return external_->bytes_read(); }

 private:
  struct Source {
    const TensorRecord* record;
    uint32_t chunk;
  };
  struct Building {
    TensorRecord record;
    std::vector<Source> sources;  // parallel to record.chunks
  };

  const Source& source_of(const TensorRecord& tensor, uint32_t chunk) const {
    const auto i = static_cast<size_t>(&tensor - index_.tensors.data());
    if (i >= index_.tensors.size() || chunk >= sources_[i].size()) {
      throw UsageError(fmt::format("read_chunk: tensor '{}' chunk {} is not in the mapped index of '{}'", tensor.key,
                                   chunk, location()));
    }
    return sources_[i][chunk];
  }

  void add(const StorageIndex& outside, const NameMapping& mapping, MappedName name,
           std::map<std::string, Building>& by_key) {
    const TensorRecord* source = outside.find_tensor(name.external);
    if (source == nullptr) {
      throw CheckpointError(fmt::format(
          "{}: name mapping '{}' expects tensor '{}' (for {}), which is not there ({} tensors; see `distckpt inspect "
          "{}`). Is this checkpoint of the model and config the mapping was made for?",
          location(), mapping.name(), name.external, place_of(name), outside.tensors.size(), location()));
    }
    if (name.key_pad_dim >= 0 && source->global_shape.size() == name.key_shape.size() - name.leading_axes) {
      // Padded rows (vocabulary) take the stored extent; the load pads or truncates them.
      name.take_pad_extent(source->global_shape[static_cast<size_t>(name.key_pad_dim - name.leading_axes)]);
    }
    const Shape expected = name.external_shape();
    if (source->global_shape != expected) {
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' has shape {}, but name mapping '{}' expects {} for {} (the layout schema's shape under the "
          "config the mapping was made for). Check the config (hidden size, heads, groups, vocabulary)",
          location(), name.external, to_string(source->global_shape), mapping.name(), to_string(expected),
          place_of(name)));
    }
    auto [it, inserted] = by_key.try_emplace(name.key);
    TensorRecord& record = it->second.record;
    if (inserted) {
      record.key = name.key;
      record.dtype = source->dtype;
      record.unrepresentable = source->unrepresentable;
      record.global_shape = name.key_shape;
    } else if (stored_dtype_name(record) != stored_dtype_name(*source) || record.global_shape != name.key_shape) {
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' is {} {} but the other tensors mapped to '{}' are {} {}; name mapping '{}' needs them to "
          "agree",
          location(), name.external, stored_dtype_name(*source), to_string(source->global_shape), name.key,
          stored_dtype_name(record), to_string(record.global_shape), mapping.name()));
    }
    for (uint32_t c = 0; c < source->chunks.size(); ++c) {
      ChunkRecord chunk = source->chunks[c];
      Box box = name.region;
      for (size_t d = 0; d < chunk.box.offset.size(); ++d) {
        const size_t at = d + static_cast<size_t>(name.leading_axes);
        box.offset[at] += chunk.box.offset[d];
        box.length[at] = chunk.box.length[d];
      }
      chunk.box = std::move(box);
      record.chunks.push_back(std::move(chunk));
      it->second.sources.push_back(Source{source, c});
    }
  }

  std::unique_ptr<StorageReader> external_;
  StorageIndex index_;
  std::vector<std::vector<Source>> sources_;  // parallel to index_.tensors, then to their chunks
};

}  // namespace

std::unique_ptr<StorageReader> map_storage(std::unique_ptr<StorageReader> external, const NameMapping& mapping) {
  return std::make_unique<MappedStorage>(std::move(external), mapping);
}

}  // namespace distckpt
