// Moving elements between a slab (whole rows of a stored piece, read into a
// host buffer), packed messages and destination tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "distckpt/core/box.h"
#include "load/checkpoint_reader.h"
#include "plan/chunk_index.h"

namespace distckpt::loading {

// Reads `slab` (whole rows of `piece`, a row-major box) into `out`, which
// holds slab.numel() elements; checksums verified.
void read_slab(CheckpointReader& reader, const TensorRecord& record, const plan::StoredPiece& piece, const Box& slab,
               uint8_t* out);

// The elements of `part` (a box; `dest` covers it) that lie in `slab`:
// copied from the slab buffer into `dest` / packed from the slab buffer into
// `out` / unpacked from `in` into `dest`. Each returns the bytes of the cut
// (0 when part and slab do not meet).
uint64_t copy_slab_to_dest(const uint8_t* slab_data, const Box& slab, at::ScalarType dtype, const Box& part,
                           const at::Tensor& dest);
uint64_t pack_from_slab(const uint8_t* slab_data, const Box& slab, at::ScalarType dtype, const Box& part, uint8_t* out);
uint64_t unpack_to_dest(const uint8_t* in, const Box& slab, at::ScalarType dtype, const Box& part,
                        const at::Tensor& dest);

}  // namespace distckpt::loading
