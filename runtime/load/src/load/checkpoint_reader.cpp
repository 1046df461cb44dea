#include "load/checkpoint_reader.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "distckpt/core/errors.h"
#include "format/dtype.h"

namespace distckpt::loading {
namespace {

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

void read_in_windows(CheckpointReader& reader, const TensorRecord& record, uint64_t window_bytes,
                     const std::function<void(int64_t flat_start, const at::Tensor& values)>& visit) {
  read_in_windows(reader, record, Box{Shape(record.global_shape.size(), 0), record.global_shape}, window_bytes, visit);
}

void read_in_windows(CheckpointReader& reader, const TensorRecord& record, const Box& region, uint64_t window_bytes,
                     const std::function<void(int64_t flat_start, const at::Tensor& values)>& visit,
                     const at::Tensor& scratch) {
  const int64_t total = region.numel();
  const uint64_t element = record.element_size();
  const auto window = static_cast<int64_t>(std::max<uint64_t>(1, window_bytes / element));
  const int64_t n = std::min(window, total);
  const auto bytes = static_cast<int64_t>(static_cast<uint64_t>(n) * element);
  at::Tensor buffer = scratch.defined() && scratch.scalar_type() == at::kByte && scratch.numel() >= bytes
                          ? scratch.narrow(0, 0, bytes).view(carrier_dtype(record))
                          : at::empty({n}, at::TensorOptions().dtype(carrier_dtype(record)));
  for (int64_t start = 0; start < total; start += window) {
    const FlatRange range{start, std::min(start + window, total)};
    at::Tensor part = buffer.narrow(0, 0, range.size());
    if (record.global_shape.empty()) {
      reader.read_region(record, region, part.view(Shape{}));  // view({}) would pick view(ScalarType)
    } else {
      for (const FlatPiece& piece : decompose_flat_range(region, range)) {
        reader.read_region(record, piece.box,
                           part.narrow(0, piece.flat_start - start, piece.box.numel()).view(piece.box.length));
      }
    }
    visit(start, part);
  }
}

CheckpointReader::CheckpointReader(const std::string& path, bool verify_checksums)
    : CheckpointReader(open_storage(path, StorageOptions{StorageFormat::detected(), verify_checksums})) {}

CheckpointReader::CheckpointReader(std::unique_ptr<StorageReader> storage) : CheckpointReader(*storage) {
  owned_ = std::move(storage);
}

CheckpointReader::CheckpointReader(StorageReader& storage) : storage_(&storage) {
  const std::vector<ObjectRecord>& objects = storage.objects();
  for (size_t i = 0; i < objects.size(); ++i) object_by_unique_key_.emplace(objects[i].unique_key(), i);
}

const TensorRecord& CheckpointReader::tensor(const std::string& key) const {
  if (const std::optional<size_t> i = storage_->find_tensor(key)) return storage_->tensor_at(*i);
  throw KeyMismatchError(fmt::format(
      "tensor '{}' is not in the checkpoint '{}' (it holds {} tensors). Fix the key (see `distckpt inspect`), "
      "or load with a strict mode that skips unexpected keys (e.g. log_unexpected)",
      key, dir(), storage_->tensor_count()));
}

uint32_t CheckpointReader::tensor_index(const TensorRecord& record) const {
  const std::optional<size_t> i = storage_->find_tensor(record.key);
  if (!i) throw std::logic_error(fmt::format("tensor '{}' is not a record of '{}'", record.key, dir()));
  return static_cast<uint32_t>(*i);
}

const ObjectRecord* CheckpointReader::find_object(const std::string& unique_key) const {
  auto it = object_by_unique_key_.find(unique_key);
  return it == object_by_unique_key_.end() ? nullptr : &storage_->objects()[it->second];
}

const plan::ChunkIndex& CheckpointReader::index_for(const TensorRecord& record) {
  std::lock_guard<std::mutex> lock(indexes_mutex_);
  auto& slot = indexes_[&record];
  if (!slot) {
    slot = std::make_unique<plan::ChunkIndex>(record,
                                              [this](uint32_t file) { return storage_->file_at(file).writer_rank; });
  }
  return *slot;
}

void CheckpointReader::copy_contiguous_span(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part,
                                            at::Tensor dest) {
  const uint64_t element = record.element_size();
  const auto [first, last] = element_span(piece.box, part);
  const uint64_t begin = piece.byte_in_chunk + static_cast<uint64_t>(first) * element;
  const uint64_t end = piece.byte_in_chunk + static_cast<uint64_t>(last) * element;
  const bool dense = static_cast<int64_t>(last - first) == part.numel();
  if (dense && dest.is_contiguous() && dest.device().is_cpu() && dest.scalar_type() == carrier_dtype(record)) {
    // The stored bytes are the destination's bytes: read straight into it.
    read_chunk_bytes(record, piece.chunk, begin, end, static_cast<uint8_t*>(dest.data_ptr()));
    return;
  }
  thread_local std::vector<uint8_t> scratch;
  scratch.resize(end - begin);
  read_chunk_bytes(record, piece.chunk, begin, end, scratch.data());
  const Shape strides = contiguous_strides(piece.box.length);
  at::Tensor source =
      at::from_blob(scratch.data(), part.length, strides, at::TensorOptions().dtype(carrier_dtype(record)));
  dest.copy_(source);
}

void CheckpointReader::copy_piece(const TensorRecord& record, const plan::StoredPiece& piece, const Box& part,
                                  at::Tensor dest) {
  const uint64_t element = record.element_size();
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

at::Tensor CheckpointReader::read_whole(const TensorRecord& record) {
  if (record.unrepresentable) {
    throw CheckpointError(fmt::format("'{}' in '{}' cannot be loaded: {}; select the other tensors (TensorSelection)",
                                      record.key, dir(), unrepresentable_reason(record)));
  }
  at::Tensor whole = at::empty(record.global_shape, at::TensorOptions().dtype(record.dtype));
  read_region(record, Box{Shape(record.global_shape.size(), 0), record.global_shape}, whole);
  return whole;
}

const TensorRecord& CheckpointReader::tensor_record(const std::string& key) const {
  const std::optional<size_t> i = storage_->find_tensor(key);
  if (!i) {
    throw CheckpointError(
        fmt::format("'{}' holds no tensor '{}'; `distckpt inspect {}` lists the stored keys", dir(), key, dir()));
  }
  return storage_->tensor_at(*i);
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
                    dir(), record.key, to_string(region), covered, region.numel(), to_string(record.global_shape)));
  }
}

}  // namespace distckpt::loading
