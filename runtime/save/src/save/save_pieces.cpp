#include "save/save_pieces.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "format/dtype.h"

namespace distckpt::saving {
namespace {

// The values a transform gives for `data`, checked against the plan.
at::Tensor transformed(const SaveTransform& transform, const ShardedTensor& tensor, const at::Tensor& data,
                       at::ScalarType stored, int rank) {
  at::Tensor out = transform.resolve_data ? transform.resolve_data(tensor, data) : data.to(stored);
  if (!out.defined() || out.numel() != data.numel() || out.scalar_type() != stored) {
    throw ShardingError(fmt::format(
        "rank {} cannot save {}: SaveOptions::transform.resolve_data gave {}, expected {} elements of {} (the "
        "stored dtype planned for it)",
        rank, tensor.describe(),
        out.defined() ? fmt::format("{} elements of {}", out.numel(), c10::toString(out.scalar_type()))
                      : std::string("an undefined tensor"),
        data.numel(), dtype_name(stored)));
  }
  return out.detach();
}

SavePiece tensor_piece(const ShardedTensor& tensor, at::ScalarType stored, const SaveTransform& transform, int rank) {
  if (!tensor.data.defined()) {
    throw ShardingError(fmt::format("rank {} cannot save {}: it has no data", rank, tensor.describe()));
  }
  at::Tensor data = tensor.data.detach();
  if (data.numel() != tensor.held_numel() || data.scalar_type() != tensor.dtype) {
    throw ShardingError(fmt::format("rank {} cannot save {}: its data has {} elements of {}, expected {} of {}", rank,
                                    tensor.describe(), data.numel(), dtype_name(data.scalar_type()),
                                    tensor.held_numel(), dtype_name(tensor.dtype)));
  }
  if (transform.resolve_data || stored != tensor.dtype) data = transformed(transform, tensor, data, stored, rank);
  if (!data.is_contiguous()) data = data.contiguous();  // the one case that needs a copy of the whole shard
  return SavePiece{tensor.key, tensor.global_shape, tensor.global_box(), tensor.flattened_range, std::move(data), {}};
}

SavePiece object_piece(const ShardedObject& object) {
  // Copied: the caller may change it once the save has staged it.
  return SavePiece{object.key,
                   object.global_shape,
                   Box{object.global_offset, Shape(object.global_offset.size(), 1)},
                   std::nullopt,
                   {},
                   std::make_shared<const std::string>(object.data)};
}

}  // namespace

std::vector<SavePiece> make_save_pieces(const PreparedSave& p, std::shared_ptr<const io::CopiesDone>* pending,
                                        bool keep_on_device) {
  std::vector<SavePiece> pieces;
  pieces.reserve(p.assignment.size());
  const size_t n = p.tensors.size();
  for (uint32_t i : p.assignment) {
    pieces.push_back(i < n ? tensor_piece(*p.tensors[i], p.stored_dtypes[i], p.options.transform, p.rank)
                           : object_piece(*p.objects[i - n]));
  }
  // Copied only once every piece is made: making one may queue kernels
  // (contiguous(), a dtype conversion) on the current stream, and the side
  // stream waits for what that stream has queued when the first copy starts.
  io::DeviceToHost to_host;
  if (!keep_on_device) {
    for (SavePiece& piece : pieces) {
      if (piece.data.defined() && !piece.data.is_cpu()) piece.data = to_host.copy(piece.data);
    }
  }
  std::shared_ptr<const io::CopiesDone> copies = to_host.done();
  if (pending != nullptr) {
    *pending = std::move(copies);
  } else if (copies) {
    copies->wait();
  }
  return pieces;
}

}  // namespace distckpt::saving
