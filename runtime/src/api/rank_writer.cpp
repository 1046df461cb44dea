#include "api/rank_writer.h"

#include "distckpt/core/errors.h"
#include "distckpt/io/checksum.h"

namespace distckpt::api {

RankWriter::RankWriter(const std::string& checkpoint_dir, std::string relative_path, int rank,
                       uint64_t block_size)
    : dir_(checkpoint_dir), relative_path_(std::move(relative_path)), rank_(rank), block_size_(block_size) {}

uint64_t RankWriter::append(const void* data, size_t n, std::vector<uint64_t>& checksums) {
  if (!file_.is_open()) file_ = io::File(io::safe_join(dir_, relative_path_), io::File::Mode::kCreateTruncate);
  const uint64_t at = offset_;
  file_.pwrite_all(data, n, at);
  checksums = io::block_checksums(data, n, block_size_);
  offset_ += n;
  return at;
}

void RankWriter::write_tensor(const ShardedTensor& tensor) {
  if (!tensor.data.defined()) {
    throw ShardingError(fmt::format("rank {} cannot save {}: it has no data", rank_, tensor.describe()));
  }
  // One chunk at a time is brought to host memory in row-major order; a
  // contiguous CPU tensor is written from its own memory without a copy.
  const at::Tensor data = tensor.data.detach();
  at::Tensor host = data.device().is_cpu() ? data : data.to(at::kCPU);
  host = host.contiguous();
  ChunkRecord chunk;
  chunk.box = tensor.global_box();
  chunk.flat = tensor.flattened_range;
  chunk.file = 0;
  chunk.byte_length = static_cast<uint64_t>(host.numel()) * host.element_size();
  chunk.byte_offset = append(host.data_ptr(), chunk.byte_length, chunk.block_checksums);

  TensorRecord& record = tensors_[tensor.key];
  if (record.key.empty()) {
    record.key = tensor.key;
    record.dtype = tensor.dtype;
    record.global_shape = tensor.global_shape;
  }
  record.chunks.push_back(std::move(chunk));
}

void RankWriter::write_object(const ShardedObject& object) {
  ObjectRecord record;
  record.key = object.key;
  record.global_shape = object.global_shape;
  record.global_offset = object.global_offset;
  record.byte_length = object.data.size();
  record.byte_offset = append(object.data.data(), object.data.size(), record.block_checksums);
  objects_.push_back(std::move(record));
}

CheckpointMetadata RankWriter::finish() {
  CheckpointMetadata fragment;
  fragment.world_size = rank_ + 1;  // only used to carry the rank; the coordinator rewrites it
  fragment.checksum_block_size = block_size_;
  if (file_.is_open()) {
    file_.sync();
    file_.close();
    fragment.files.push_back(FileRecord{relative_path_, offset_, rank_});
  }
  for (auto& [key, record] : tensors_) fragment.tensors.push_back(std::move(record));
  std::sort(objects_.begin(), objects_.end(),
            [](const ObjectRecord& a, const ObjectRecord& b) { return a.unique_key() < b.unique_key(); });
  fragment.objects = std::move(objects_);
  tensors_.clear();
  objects_.clear();
  return fragment;
}

}  // namespace distckpt::api
