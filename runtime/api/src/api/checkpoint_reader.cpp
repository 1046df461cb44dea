#include "api/checkpoint_reader.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <cstring>

#include "distckpt/core/errors.h"
#include "format/commit.h"
#include "format/common_state.h"
#include "format/dtype.h"
#include "io/checksum.h"

namespace distckpt::api {
namespace {

constexpr uint64_t kMaxMetadataBytes = uint64_t{4} << 30;

// Byte span of `part` inside a row-major piece: first and one-past-last element.
std::pair<int64_t, int64_t> element_span(const Box& piece, const Box& part) {
  const Shape strides = contiguous_strides(piece.length);
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < piece.ndim(); ++d) {
    const int64_t rel = part.offset[d] - piece.offset[d];
    first += rel * strides[d];
    last += (rel + part.length[d] - 1) * strides[d];
  }
  return {first, last + 1};
}

}  // namespace

at::Tensor sub_view(const at::Tensor& view, const Box& outer, const Box& inner) {
  at::Tensor out = view;
  for (size_t d = 0; d < outer.ndim(); ++d) {
    const int64_t start = inner.offset[d] - outer.offset[d];
    if (start != 0 || inner.length[d] != outer.length[d]) {
      out = out.narrow(static_cast<int64_t>(d), start, inner.length[d]);
    }
  }
  return out;
}

CheckpointReader::CheckpointReader(std::string dir, bool verify_checksums)
    : dir_(std::move(dir)), verify_(verify_checksums) {
  std::optional<CheckpointConfig> config = maybe_load_config(dir_);
  if (!config) {
    throw CheckpointError(fmt::format(
        "'{}' holds no committed distckpt checkpoint ({} is missing): the save never finished or the path is "
        "wrong",
        dir_, kCommitFile));
  }
  config_ = std::move(*config);
  // Version 1 markers record no checksums: the file name is fixed.
  const std::string path = io::safe_join(dir_, config_.metadata ? config_.metadata->path : kMetadataFile);
  const std::string bytes = io::read_file(path, kMaxMetadataBytes);
  if (config_.metadata) check_recorded_file(*config_.metadata, bytes, path);
  metadata_ = decode_metadata(bytes, path);
  if (metadata_.format_version != static_cast<uint32_t>(config_.version) ||
      metadata_.world_size != config_.world_size) {
    throw CorruptionError(fmt::format(
        "{}: format version {} and world size {} disagree with the commit marker's (version {}, {} ranks); the "
        "checkpoint is corrupt or mixes files of two checkpoints",
        path, metadata_.format_version, metadata_.world_size, config_.version, config_.world_size));
  }
  if (config_.common && config_.common->path != metadata_.common_file) {
    throw CorruptionError(
        fmt::format("{}: the common state file is '{}' but the commit marker records '{}'; the checkpoint is corrupt",
                    path, metadata_.common_file, config_.common->path));
  }
  check_files(metadata_, dir_);
  for (size_t i = 0; i < metadata_.objects.size(); ++i) {
    object_by_unique_key_.emplace(metadata_.objects[i].unique_key(), i);
  }
}

const TensorRecord& CheckpointReader::tensor(const std::string& key) const {
  if (const TensorRecord* record = metadata_.find_tensor(key)) return *record;
  throw KeyMismatchError(fmt::format(
      "tensor '{}' is not in the checkpoint '{}' (it holds {} tensors). Fix the key (see `distckpt inspect`), "
      "or load with a strict mode that skips unexpected keys (e.g. log_unexpected)",
      key, dir_, metadata_.tensors.size()));
}

const ObjectRecord* CheckpointReader::find_object(const std::string& unique_key) const {
  auto it = object_by_unique_key_.find(unique_key);
  return it == object_by_unique_key_.end() ? nullptr : &metadata_.objects[it->second];
}

const plan::ChunkIndex& CheckpointReader::index_for(const TensorRecord& record) {
  std::lock_guard<std::mutex> lock(indexes_mutex_);
  auto& slot = indexes_[&record];
  if (!slot) slot = std::make_unique<plan::ChunkIndex>(record);
  return *slot;
}

std::shared_ptr<io::File> CheckpointReader::file(uint32_t index) {
  std::lock_guard<std::mutex> lock(files_mutex_);
  for (auto it = open_files_.begin(); it != open_files_.end(); ++it) {
    if (it->first == index) {
      open_files_.splice(open_files_.begin(), open_files_, it);
      return open_files_.front().second;
    }
  }
  // A file evicted here stays open until the threads reading it are done.
  if (open_files_.size() >= kMaxOpenFiles) open_files_.pop_back();
  const std::string path = io::safe_join(dir_, metadata_.files.at(index).path);
  open_files_.emplace_front(index, std::make_shared<io::File>(path, io::File::Mode::kRead));
  return open_files_.front().second;
}

void CheckpointReader::read_chunk_bytes(const TensorRecord& record, uint32_t chunk, uint64_t begin, uint64_t end,
                                        uint8_t* out) {
  const ChunkRecord& c = record.chunks.at(chunk);
  read_verified(c.file, c.byte_offset, c.byte_length, c.block_checksums, begin, end, out,
                fmt::format("'{}' chunk {}", record.key, chunk));
}

void CheckpointReader::read_verified(uint32_t file_index, uint64_t base, uint64_t length,
                                     const std::vector<uint64_t>& checksums, uint64_t begin, uint64_t end, uint8_t* out,
                                     const std::string& what) {
  const std::shared_ptr<io::File> handle = file(file_index);
  const io::File& f = *handle;
  if (!verify_) {
    f.pread_all(out, end - begin, base + begin);
    bytes_read_ += end - begin;
    return;
  }
  const uint64_t block = metadata_.checksum_block_size;
  auto verify_block = [&](const uint8_t* data, uint64_t index) {
    const uint64_t s = index * block, e = std::min(s + block, length);
    if (io::xxh3(data, e - s) != checksums[index]) {
      throw CorruptionError(fmt::format(
          "checksum mismatch in {} (file '{}', bytes {}..{}): the checkpoint is corrupt; run `distckpt verify {}` "
          "and load an intact copy",
          what, metadata_.files[file_index].path, base + s, base + e, dir_));
    }
  };
  uint64_t pos = begin;
  while (pos < end) {
    const uint64_t index = pos / block;
    const uint64_t block_begin = index * block;
    const uint64_t block_end = std::min(block_begin + block, length);
    if (block_begin >= begin && block_end <= end) {
      // A run of whole blocks: one read straight into `out`, then verify each.
      uint64_t run_end = block_end;
      while (run_end < end && std::min(run_end + block, length) <= end) run_end = std::min(run_end + block, length);
      f.pread_all(out + (block_begin - begin), run_end - block_begin, base + block_begin);
      bytes_read_ += run_end - block_begin;
      for (uint64_t s = block_begin; s < run_end; s += block) verify_block(out + (s - begin), s / block);
      pos = run_end;
      continue;
    }
    // A block only partly needed: read it whole into scratch, verify, copy the needed part.
    thread_local std::vector<uint8_t> block_scratch;
    block_scratch.resize(block_end - block_begin);
    f.pread_all(block_scratch.data(), block_end - block_begin, base + block_begin);
    bytes_read_ += block_end - block_begin;
    verify_block(block_scratch.data(), index);
    const uint64_t to = std::min(end, block_end);
    std::memcpy(out + (pos - begin), block_scratch.data() + (pos - block_begin), to - pos);
    pos = to;
  }
}

void CheckpointReader::copy_contiguous_span(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part,
                                            at::Tensor dest) {
  const ChunkRecord& chunk = record.chunks[piece.chunk];
  const uint64_t element = dtype_size(record.dtype);
  const auto [first, last] = element_span(piece.box, part);
  const uint64_t begin = piece.byte_in_chunk + static_cast<uint64_t>(first) * element;
  const uint64_t end = piece.byte_in_chunk + static_cast<uint64_t>(last) * element;
  const std::string what = fmt::format("'{}' chunk {}", record.key, piece.chunk);
  const bool dense = static_cast<int64_t>(last - first) == part.numel();
  if (dense && dest.is_contiguous() && dest.device().is_cpu()) {
    // The stored bytes are the destination's bytes: read straight into it.
    read_verified(chunk.file, chunk.byte_offset, chunk.byte_length, chunk.block_checksums, begin, end,
                  static_cast<uint8_t*>(dest.data_ptr()), what);
    return;
  }
  thread_local std::vector<uint8_t> scratch;
  scratch.resize(end - begin);
  read_verified(chunk.file, chunk.byte_offset, chunk.byte_length, chunk.block_checksums, begin, end, scratch.data(),
                what);
  const Shape strides = contiguous_strides(piece.box.length);
  at::Tensor source = at::from_blob(scratch.data(), part.length, strides, at::TensorOptions().dtype(record.dtype));
  dest.copy_(source);
}

void CheckpointReader::copy_piece(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part,
                                  at::Tensor dest) {
  const uint64_t element = dtype_size(record.dtype);
  const auto [first, last] = element_span(piece.box, part);
  const bool dense = static_cast<int64_t>(last - first) == part.numel();
  if (dense || static_cast<uint64_t>(last - first) * element <= kCopyBatchBytes || part.ndim() == 0) {
    copy_contiguous_span(record, piece, part, dest);
    return;
  }
  // Too sparse and too large for one scratch span: split along the first axis
  // with more than one index, in slabs whose span fits the batch.
  size_t axis = 0;
  while (axis < part.ndim() && part.length[axis] == 1) ++axis;
  const Shape strides = contiguous_strides(piece.box.length);
  const auto [row_first, row_last] = [&] {
    Box row = part;
    row.length[axis] = 1;
    return element_span(piece.box, row);
  }();
  const uint64_t row_bytes = static_cast<uint64_t>(row_last - row_first) * element;
  const uint64_t step_bytes = static_cast<uint64_t>(strides[axis]) * element;
  const int64_t rows_per_slab =
      row_bytes >= kCopyBatchBytes ? 1 : static_cast<int64_t>((kCopyBatchBytes - row_bytes) / step_bytes + 1);
  for (int64_t start = 0; start < part.length[axis]; start += rows_per_slab) {
    Box slab = part;
    slab.offset[axis] += start;
    slab.length[axis] = std::min(rows_per_slab, part.length[axis] - start);
    copy_piece(record, piece, slab, sub_view(dest, part, slab));
  }
}

void CheckpointReader::read_region(const TensorRecord& record, const Box& region, at::Tensor dest) {
  std::vector<const plan::StoredPiece*> pieces;
  index_for(record).query(region, pieces);
  int64_t covered = 0;
  for (const plan::StoredPiece* piece : pieces) {
    const Box part = region.ndim() == 0 ? region : *intersect(region, piece->box);
    copy_piece(record, *piece, part, sub_view(dest, region, part));
    covered += part.numel();
  }
  if (covered != region.numel()) {
    throw CheckpointError(
        fmt::format("the checkpoint '{}' does not hold all of '{}' {}: {} of {} elements are stored (global shape {})",
                    dir_, record.key, to_string(region), covered, region.numel(), to_string(record.global_shape)));
  }
}

std::string CheckpointReader::read_object(const ObjectRecord& record) {
  std::string bytes(record.byte_length, '\0');
  read_verified(record.file, record.byte_offset, record.byte_length, record.block_checksums, 0, record.byte_length,
                reinterpret_cast<uint8_t*>(bytes.data()), fmt::format("object '{}'", record.unique_key()));
  return bytes;
}

Value CheckpointReader::read_common_state() const {
  if (metadata_.common_file.empty()) return Value::dict();
  const std::string path = io::safe_join(dir_, metadata_.common_file);
  const std::string bytes = io::read_file(path, config_.common ? config_.common->bytes : io::file_size(path));
  if (config_.common) check_recorded_file(*config_.common, bytes, path);
  return decode_common_state(bytes, path);
}

}  // namespace distckpt::api
