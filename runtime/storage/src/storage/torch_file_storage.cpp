#include "storage/torch_file_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "distckpt/core/errors.h"

namespace distckpt::storage {

TorchFileStorage::TorchFileStorage(const std::string& path) : reader_(path) {
  const std::filesystem::path file(path);
  index_.files.push_back(FileRecord{file.filename().string(), io::file_size(path), 0});
  for (size_t i = 0; i < reader_.tensors().size(); ++i) {
    const auto& [name, layout] = reader_.tensors()[i];
    if (!reader_.contiguous(i)) {
      throw CheckpointError(fmt::format(
          "'{}' in '{}' is a strided view of a larger storage, which load() cannot read in place; convert the file "
          "first (distckpt convert {} OUT --to safetensors) and load that",
          name, path, path));
    }
    const TorchFileReader::Placement where = reader_.placement(i);
    TensorRecord t;
    t.key = name;
    t.dtype = layout.scalar_type();
    t.global_shape = layout.sizes().vec();
    ChunkRecord c;
    c.box = Box{Shape(t.global_shape.size(), 0), t.global_shape};
    c.byte_offset = where.file_offset;
    c.byte_length = where.bytes;
    t.chunks.push_back(std::move(c));
    if (where.record && where.file_offset == where.record->data_offset && where.bytes == where.record->size) {
      whole_record_.emplace(name, where.record);
    }
    index_.tensors.push_back(std::move(t));
  }
  std::sort(index_.tensors.begin(), index_.tensors.end(),  // names are unique (the reader checks)
            [](const TensorRecord& a, const TensorRecord& b) { return a.key < b.key; });
  const std::string dir = file.has_parent_path() ? file.parent_path().string() : ".";
  // The file is the one the user named, not a name read from a checkpoint.
  ranges_ = std::make_unique<FileRanges>(dir, index_, /*verify_checksums=*/false, FileRanges::Links::kAnywhere);
}

void TorchFileStorage::read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end,
                                  uint8_t* out) {
  ranges_->read_chunk(tensor, chunk, begin, end, out);
  const auto whole = whole_record_.find(tensor.key);
  if (whole != whole_record_.end() && begin == 0 && end == whole->second->size)
    reader_.check_record(*whole->second, out);
}

}  // namespace distckpt::storage
