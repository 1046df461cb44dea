#include "load/slab_copy.h"

#include <ATen/Functions.h>

#include "format/dtype.h"

namespace distckpt::loading {
namespace {

at::Tensor slab_view(const uint8_t* data, const Box& slab, at::ScalarType dtype) {
  return at::from_blob(const_cast<uint8_t*>(data), slab.length, at::TensorOptions().dtype(dtype));
}

std::optional<Box> cut_of(const Box& part, const Box& slab) {
  if (slab.ndim() == 0) return part;
  return intersect(part, slab);
}

uint64_t bytes_of(const Box& box, at::ScalarType dtype) {
  return static_cast<uint64_t>(box.numel()) * dtype_size(dtype);
}

}  // namespace

void read_slab(CheckpointReader& reader, const TensorRecord& record, const plan::StoredPiece& piece, const Box& slab,
               uint8_t* out) {
  const uint64_t element = record.element_size();
  uint64_t row = element;
  for (size_t d = 1; d < piece.box.ndim(); ++d) row *= static_cast<uint64_t>(piece.box.length[d]);
  const uint64_t first_row = piece.box.ndim() == 0 ? 0 : static_cast<uint64_t>(slab.offset[0] - piece.box.offset[0]);
  const uint64_t begin = piece.byte_in_chunk + first_row * row;
  reader.read_chunk_bytes(record, piece.chunk, begin, begin + static_cast<uint64_t>(slab.numel()) * element, out);
}

uint64_t copy_slab_to_dest(const uint8_t* slab_data, const Box& slab, at::ScalarType dtype, const Box& part,
                           const at::Tensor& dest) {
  const std::optional<Box> cut = cut_of(part, slab);
  if (!cut) return 0;
  sub_view(dest, part, *cut).copy_(sub_view(slab_view(slab_data, slab, dtype), slab, *cut));
  return bytes_of(*cut, dtype);
}

uint64_t pack_from_slab(const uint8_t* slab_data, const Box& slab, at::ScalarType dtype, const Box& part,
                        uint8_t* out) {
  const std::optional<Box> cut = cut_of(part, slab);
  if (!cut) return 0;
  at::from_blob(out, cut->length, at::TensorOptions().dtype(dtype))
      .copy_(sub_view(slab_view(slab_data, slab, dtype), slab, *cut));
  return bytes_of(*cut, dtype);
}

uint64_t unpack_to_dest(const uint8_t* in, const Box& slab, at::ScalarType dtype, const Box& part,
                        const at::Tensor& dest) {
  const std::optional<Box> cut = cut_of(part, slab);
  if (!cut) return 0;
  sub_view(dest, part, *cut)
      .copy_(at::from_blob(const_cast<uint8_t*>(in), cut->length, at::TensorOptions().dtype(dtype)));
  return bytes_of(*cut, dtype);
}

}  // namespace distckpt::loading
