#include "storage/torch_file_storage.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "distckpt/core/errors.h"

namespace distckpt::storage {

TorchFileStorage::TorchFileStorage(std::shared_ptr<Backend> backend, const std::string& file)
    : reader_(backend->open(file), backend->describe(file)) {
  index_.files.push_back(FileRecord{file, reader_.file_size(), 0});
  for (size_t i = 0; i < reader_.tensors().size(); ++i) {
    const auto& [name, layout] = reader_.tensors()[i];
    TensorRecord t;
    t.key = name;
    t.dtype = layout.scalar_type();
    t.global_shape = layout.sizes().vec();
    ChunkRecord c;
    c.box = Box{Shape(t.global_shape.size(), 0), t.global_shape};
    c.byte_length = static_cast<uint64_t>(layout.numel()) * layout.element_size();
    if (reader_.contiguous(i)) {
      const TorchFileReader::Placement where = reader_.placement(i);
      c.byte_offset = where.file_offset;
      if (where.record && where.file_offset == where.record->data_offset && where.bytes == where.record->size) {
        whole_record_.emplace(name, where.record);
      }
    } else {
      strided_.emplace(name, i);  // no byte range of the file holds it row-major: read through strided_values()
    }
    t.chunks.push_back(std::move(c));
    index_.tensors.push_back(std::move(t));
  }
  std::sort(index_.tensors.begin(), index_.tensors.end(),  // names are unique (the reader checks)
            [](const TensorRecord& a, const TensorRecord& b) { return a.key < b.key; });
  ranges_ = std::make_unique<FileRanges>(std::move(backend), index_, /*verify_checksums=*/false);
}

std::shared_ptr<const at::Tensor> TorchFileStorage::strided_values(size_t i) {
  // Held while the storage is read: the other threads reading this view wait
  // for it rather than read it again.
  std::lock_guard<std::mutex> lock(strided_mutex_);
  const auto cached = strided_cached_.find(i);
  if (cached != strided_cached_.end()) {
    strided_cache_.splice(strided_cache_.begin(), strided_cache_, cached->second);
    return cached->second->second;
  }
  const at::Tensor view = reader_.read(i);  // the storage whole, its CRC-32 checked
  strided_bytes_read_ += view.storage().nbytes();
  strided_cache_.emplace_front(i, std::make_shared<const at::Tensor>(view.contiguous()));
  strided_cached_.emplace(i, strided_cache_.begin());
  strided_cache_bytes_ += strided_cache_.front().second->nbytes();
  while (strided_cache_bytes_ > kStridedCacheBytes && strided_cache_.size() > 1) {  // the newest stays
    strided_cache_bytes_ -= strided_cache_.back().second->nbytes();
    strided_cached_.erase(strided_cache_.back().first);
    strided_cache_.pop_back();
  }
  return strided_cache_.front().second;
}

void TorchFileStorage::read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end,
                                  uint8_t* out) {
  const auto strided = strided_.find(tensor.key);
  if (strided != strided_.end()) {
    const std::shared_ptr<const at::Tensor> values = strided_values(strided->second);
    if (begin > end || end > values->nbytes()) {
      throw UsageError(
          fmt::format("bytes [{}, {}) of '{}' asked for; it has {}", begin, end, tensor.key, values->nbytes()));
    }
    std::memcpy(out, static_cast<const uint8_t*>(values->data_ptr()) + begin, end - begin);
    return;
  }
  ranges_->read_chunk(tensor, chunk, begin, end, out);
  const auto whole = whole_record_.find(tensor.key);
  if (whole != whole_record_.end() && begin == 0 && end == whole->second->size)
    reader_.check_record(*whole->second, out);
}

void TorchFileStorage::read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) {
  if (strided_.count(tensor.key) == 0) return FileBackedStorage::read_chunk_runs(tensor, chunk, runs);
  for (const ByteRun& run : runs) read_chunk(tensor, chunk, run.offset, run.offset + run.bytes, run.out);
}

}  // namespace distckpt::storage
