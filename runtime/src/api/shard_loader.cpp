#include "api/shard_loader.h"

#include "distckpt/core/errors.h"
#include "distckpt/format/dtype.h"

namespace distckpt::api {
namespace {

void check_compatible(const CheckpointReader& reader, const TensorRecord& stored, const ShardedTensor& request) {
  if (stored.dtype != request.dtype) {
    throw ShardingError(fmt::format(
        "'{}' is stored as {} in '{}' but requested as {}; request the stored dtype and convert after loading",
        request.key, dtype_name(stored.dtype), reader.dir(), dtype_name(request.dtype)));
  }
  if (stored.global_shape.size() != request.global_shape.size() ||
      (stored.global_shape != request.global_shape && !request.allow_shape_mismatch)) {
    throw ShardingError(fmt::format(
        "'{}' has global shape {} in '{}' but {} was requested; set allow_shape_mismatch on tensors whose "
        "padding may change (e.g. padded vocabularies), otherwise fix the layout",
        request.key, to_string(stored.global_shape), reader.dir(), to_string(request.global_shape)));
  }
}

}  // namespace

at::Tensor load_sharded_tensor(CheckpointReader& reader, const ShardedTensor& request) {
  // Loading writes into the caller's tensors (often parameters that require
  // grad); those writes are not part of any graph.
  at::NoGradGuard no_grad;
  const TensorRecord& stored = reader.tensor(request.key);
  check_compatible(reader, stored, request);
  at::Tensor data = request.data;
  if (!data.defined()) {
    const Shape shape = request.flattened_range ? Shape{request.flattened_range->size()} : request.local_shape;
    data = at::empty(shape, at::TensorOptions().dtype(request.dtype));
  }
  const bool padded = stored.global_shape != request.global_shape;
  const Box stored_whole{Shape(stored.global_shape.size(), 0), stored.global_shape};
  // Reads `box` of the global tensor into `view`; where the request reaches
  // past the stored shape the destination is zero-filled.
  auto fill = [&](const Box& box, const at::Tensor& view) {
    if (box.empty()) return;
    const std::optional<Box> inside = padded ? intersect(box, stored_whole) : std::optional<Box>(box);
    if (!inside || *inside != box) view.zero_();
    if (inside) reader.read_region(stored, *inside, sub_view(view, box, *inside));
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

Value load_leaf(CheckpointReader& reader, const Value& leaf) {
  if (leaf.kind() == Kind::kShardedTensor) return Value(load_sharded_tensor(reader, leaf.as_sharded_tensor()));
  const ShardedObject& object = leaf.as_sharded_object();
  const ObjectRecord* stored = reader.find_object(object.unique_key());
  if (!stored) {
    throw KeyMismatchError(fmt::format(
        "sharded object '{}' is not in the checkpoint '{}'; fix its key/shard position or load with a strict mode "
        "that skips unexpected keys",
        object.unique_key(), reader.dir()));
  }
  return Value(reader.read_object(*stored));
}

}  // namespace distckpt::api
