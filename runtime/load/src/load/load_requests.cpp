#include "load/load_requests.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "format/dtype.h"

namespace distckpt::loading {
namespace {

void check_compatible(const CheckpointReader& reader, const TensorRecord& stored, const ShardedTensor& request,
                      bool convert_dtype) {
  if (stored.unrepresentable) {
    throw ShardingError(fmt::format(
        "'{}' in '{}' cannot be loaded: {}. Load it with a build that has the type, or leave it out of the request "
        "(the other tensors load)",
        request.key, reader.dir(), unrepresentable_reason(stored)));
  }
  const bool convertible = convert_dtype && at::isFloatingType(stored.dtype) && at::isFloatingType(request.dtype);
  if (stored.dtype != request.dtype && !convertible) {
    throw ShardingError(
        fmt::format("'{}' is stored as {} in '{}' but requested as {}; request the stored dtype, set "
                    "LoadOptions::convert_dtype to convert between floating-point types as it loads, or convert "
                    "in LoadOptions::commit_tensor",
                    request.key, dtype_name(stored.dtype), reader.dir(), dtype_name(request.dtype)));
  }
  if (stored.global_shape.size() != request.global_shape.size() ||
      (stored.global_shape != request.global_shape && !request.allow_shape_mismatch)) {
    throw ShardingError(
        fmt::format("'{}' has global shape {} in '{}' but {} was requested; set allow_shape_mismatch on tensors whose "
                    "padding may change (e.g. padded vocabularies), otherwise fix the layout",
                    request.key, to_string(stored.global_shape), reader.dir(), to_string(request.global_shape)));
  }
}

// The reads that fill `region` of the stored tensor into `view`.
void plan_region(CheckpointReader& reader, const TensorRecord& stored, const Box& region, const at::Tensor& view,
                 std::vector<TensorRead>& reads) {
  const plan::ChunkIndex& index = reader.index_for(stored);
  std::vector<const plan::StoredPiece*> pieces;
  index.query(region, pieces);
  const uint32_t tensor = reader.tensor_index(stored);
  int64_t covered = 0;
  for (const plan::StoredPiece* piece : pieces) {
    const Box part = region.ndim() == 0 ? region : *intersect(region, piece->box);
    const auto piece_index = static_cast<uint32_t>(piece - index.pieces().data());
    reads.push_back(TensorRead{plan::PieceNeed{tensor, piece_index, part}, sub_view(view, region, part)});
    covered += part.numel();
  }
  if (covered != region.numel()) {
    throw CheckpointError(fmt::format(
        "the checkpoint '{}' does not hold all of '{}' {}: {} of {} elements are stored (global shape {})",
        reader.dir(), stored.key, to_string(region), covered, region.numel(), to_string(stored.global_shape)));
  }
}

}  // namespace

at::Tensor plan_tensor_reads(CheckpointReader& reader, const ShardedTensor& request, std::vector<TensorRead>& reads,
                             bool convert_dtype) {
  // Loading writes into the caller's tensors (often parameters that require
  // grad); those writes are not part of any graph.
  at::NoGradGuard no_grad;
  const TensorRecord& stored = reader.tensor(request.key);
  check_compatible(reader, stored, request, convert_dtype);
  at::Tensor data = request.data;
  if (!data.defined()) {
    const Shape shape = request.flattened_range ? Shape{request.flattened_range->size()} : request.local_shape;
    // Made on its CUDA device and read into through pinned host memory
    // (load/device_staging.h); other devices get the tensor when it is read.
    const at::Device device = request.device.is_cuda() ? request.device : at::Device(at::kCPU);
    data = at::empty(shape, at::TensorOptions().dtype(request.dtype).device(device));
  }
  const bool padded = stored.global_shape != request.global_shape;
  const Box stored_whole{Shape(stored.global_shape.size(), 0), stored.global_shape};
  // Where the request reaches past the stored shape the destination is zero-filled.
  auto fill = [&](const Box& box, const at::Tensor& view) {
    if (box.empty()) return;
    const std::optional<Box> inside = padded ? intersect(box, stored_whole) : std::optional<Box>(box);
    if (!inside || *inside != box) view.zero_();
    if (inside) plan_region(reader, stored, *inside, sub_view(view, box, *inside), reads);
  };
  if (request.flattened_range) {
    const FlatRange range = *request.flattened_range;
    for (const FlatPiece& piece : decompose_flat_range(request.global_box(), range)) {
      fill(piece.box, data.narrow(0, piece.flat_start - range.start, piece.box.numel()).view(piece.box.length));
    }
  } else {
    at::Tensor view = data;
    for (int64_t i = 0; i < request.prepend_axis_num; ++i) view = view.unsqueeze(0);
    fill(request.global_box(), view);
  }
  return data;
}

Value load_object(CheckpointReader& reader, const ShardedObject& object) {
  const ObjectRecord* stored = reader.find_object(object.unique_key());
  if (!stored) {
    throw KeyMismatchError(fmt::format(
        "sharded object '{}' is not in the checkpoint '{}'; fix its key/shard position or load with a strict mode "
        "that skips unexpected keys",
        object.unique_key(), reader.dir()));
  }
  return Value(reader.read_object(*stored));
}

}  // namespace distckpt::loading
