// ShardedTensor: factories, the metadata integrity check and Megatron's narrow.
#include "distckpt/core/sharded_tensor.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>

#include "distckpt/core/errors.h"

namespace distckpt {

bool is_main_replica(const ReplicaId& id) {
  return std::all_of(id.begin(), id.end(), [](int64_t r) { return r == 0; });
}

std::string to_string(const ReplicaId& id) { return fmt::format("({})", fmt::join(id, ", ")); }

namespace {

// Python-style names keep messages readable next to Megatron logs. The format
// layer owns the on-disk names; core cannot depend on it.
std::string dtype_label(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    case at::kComplexFloat:
      return "complex64";
    case at::kComplexDouble:
      return "complex128";
    default:
      return c10::toString(t);
  }
}

Shape shape_of(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

at::Tensor require_data(const std::string& key, at::Tensor data, const char* factory) {
  if (!data.defined()) {
    throw ShardingError(
        fmt::format("ShardedTensor '{}': {} needs a defined data tensor to take "
                    "the local shape from; pass the local shard",
                    key, factory));
  }
  return data;
}

// Fills global shape, offset and fragmentations of a regular grid.
void place_on_grid(ShardedTensor& st, const std::vector<RankOffset>& rank_offsets) {
  const int64_t prepend = st.prepend_axis_num;
  if (prepend < 0) {
    throw ShardingError(fmt::format("ShardedTensor '{}': prepend_axis_num {} is negative", st.key, prepend));
  }
  const int64_t ndim = prepend + static_cast<int64_t>(st.local_shape.size());
  Shape local_extent(static_cast<size_t>(prepend), 1);
  local_extent.insert(local_extent.end(), st.local_shape.begin(), st.local_shape.end());

  st.global_shape = local_extent;
  st.global_offset.assign(static_cast<size_t>(ndim), 0);
  st.axis_fragmentations.assign(static_cast<size_t>(ndim), 1);
  std::vector<bool> seen(static_cast<size_t>(ndim), false);
  for (const RankOffset& ro : rank_offsets) {
    if (ro.axis < 0 || ro.axis >= ndim) {
      throw ShardingError(
          fmt::format("ShardedTensor '{}': rank offset axis {} is outside the {} axes of the global tensor "
                      "(local_shape {} plus {} prepended axes)",
                      st.key, ro.axis, ndim, to_string(st.local_shape), prepend));
    }
    const auto axis = static_cast<size_t>(ro.axis);
    if (seen[axis]) {
      throw ShardingError(fmt::format("ShardedTensor '{}': axis {} appears twice in rank_offsets; give each axis once",
                                      st.key, ro.axis));
    }
    seen[axis] = true;
    if (ro.fragments < 1) {
      throw ShardingError(
          fmt::format("ShardedTensor '{}': axis {} has {} fragments; the number of fragments must be >= 1", st.key,
                      ro.axis, ro.fragments));
    }
    if (ro.rank_offset < 0 || ro.rank_offset >= ro.fragments) {
      throw ShardingError(fmt::format("ShardedTensor '{}': rank offset {} on axis {} is outside [0, {}) fragments",
                                      st.key, ro.rank_offset, ro.axis, ro.fragments));
    }
    st.global_shape[axis] = local_extent[axis] * ro.fragments;
    st.global_offset[axis] = local_extent[axis] * ro.rank_offset;
    st.axis_fragmentations[axis] = ro.fragments;
  }
}

}  // namespace

ShardedTensor ShardedTensor::from_rank_offsets(std::string key, at::Tensor data,
                                               const std::vector<RankOffset>& rank_offsets, ReplicaId replica_id,
                                               int64_t prepend_axis_num, bool allow_shape_mismatch) {
  ShardedTensor st;
  st.key = std::move(key);
  st.data = require_data(st.key, std::move(data), "from_rank_offsets");
  st.dtype = st.data.scalar_type();
  st.local_shape = shape_of(st.data);
  st.replica_id = std::move(replica_id);
  st.prepend_axis_num = prepend_axis_num;
  st.allow_shape_mismatch = allow_shape_mismatch;
  place_on_grid(st, rank_offsets);
  st.validate_metadata_integrity();
  return st;
}

ShardedTensor ShardedTensor::from_rank_offsets_flat(std::string key, at::Tensor flat_data, Shape local_shape,
                                                    const std::vector<RankOffset>& rank_offsets,
                                                    FlatRange flattened_range, ReplicaId replica_id,
                                                    int64_t prepend_axis_num) {
  ShardedTensor st;
  st.key = std::move(key);
  st.data = require_data(st.key, std::move(flat_data), "from_rank_offsets_flat");
  st.dtype = st.data.scalar_type();
  st.local_shape = std::move(local_shape);
  st.replica_id = std::move(replica_id);
  st.prepend_axis_num = prepend_axis_num;
  st.flattened_range = flattened_range;
  place_on_grid(st, rank_offsets);
  st.validate_metadata_integrity();
  return st;
}

ShardedTensor ShardedTensor::from_global_offset(std::string key, at::Tensor data, Shape global_shape,
                                                Shape global_offset, ReplicaId replica_id, int64_t prepend_axis_num,
                                                bool allow_shape_mismatch) {
  ShardedTensor st;
  st.key = std::move(key);
  st.data = require_data(st.key, std::move(data), "from_global_offset");
  st.dtype = st.data.scalar_type();
  st.local_shape = shape_of(st.data);
  st.global_shape = std::move(global_shape);
  st.global_offset = std::move(global_offset);
  st.replica_id = std::move(replica_id);
  st.prepend_axis_num = prepend_axis_num;
  st.allow_shape_mismatch = allow_shape_mismatch;
  st.validate_metadata_integrity();
  return st;
}

void ShardedTensor::validate_metadata_integrity() const {
  auto fail = [this](const std::string& problem) {
    throw ShardingError(fmt::format("ShardedTensor '{}': {} ({})", key, problem, describe()));
  };
  if (key.empty()) fail("the key is empty; every sharded tensor needs a checkpoint key");
  if (data.defined() && data.scalar_type() != dtype) {
    fail(
        fmt::format("data has dtype {} but the metadata says {}", dtype_label(data.scalar_type()), dtype_label(dtype)));
  }
  if (data.defined() && !flattened_range && shape_of(data) != local_shape) {
    fail(fmt::format("data has shape {} but local_shape is {}", to_string(shape_of(data)), to_string(local_shape)));
  }
  if (flattened_range) {
    const FlatRange& r = *flattened_range;
    if (r.start < 0 || r.start > r.stop || r.stop > numel(local_shape)) {
      fail(fmt::format("flattened_range [{}, {}) is not inside [0, {}] of local_shape {}", r.start, r.stop,
                       numel(local_shape), to_string(local_shape)));
    }
    if (data.defined() && (data.dim() != 1 || data.numel() != r.size())) {
      fail(fmt::format("flattened data must be 1-D with {} elements, got shape {}", r.size(),
                       to_string(shape_of(data))));
    }
  }
  if (prepend_axis_num < 0) fail(fmt::format("prepend_axis_num {} is negative", prepend_axis_num));
  if (global_shape.size() != global_offset.size()) {
    fail(fmt::format("global_shape {} and global_offset {} have different ranks", to_string(global_shape),
                     to_string(global_offset)));
  }
  if (local_shape.size() + static_cast<size_t>(prepend_axis_num) != global_shape.size()) {
    fail(
        fmt::format("local_shape {} with {} prepended axes does not match the rank of "
                    "global_shape {}",
                    to_string(local_shape), prepend_axis_num, to_string(global_shape)));
  }
  const Box box = global_box();
  for (size_t a = 0; a < global_shape.size(); ++a) {
    if (global_shape[a] < 0 || global_offset[a] < 0 || box.length[a] < 0) {
      fail(fmt::format("axis {} has a negative extent or offset", a));
    }
    const bool prepended = a < static_cast<size_t>(prepend_axis_num);
    // Extents and offsets are non-negative here, so the subtraction cannot overflow (a sum could).
    const bool fits =
        prepended ? global_offset[a] < global_shape[a] : global_offset[a] <= global_shape[a] - box.length[a];
    if (!fits) {
      // The end may not fit in int64; both terms are non-negative, so it fits in uint64.
      const uint64_t end = static_cast<uint64_t>(global_offset[a]) + static_cast<uint64_t>(box.length[a]);
      fail(fmt::format("on axis {} the chunk [{}, {}) exceeds the global extent {}", a, global_offset[a], end,
                       global_shape[a]));
    }
  }
  if (!axis_fragmentations.empty()) {
    if (axis_fragmentations.size() != global_shape.size()) {
      fail(fmt::format("axis_fragmentations {} does not have one entry per global axis",
                       to_string(axis_fragmentations)));
    }
    for (size_t a = static_cast<size_t>(prepend_axis_num); a < global_shape.size(); ++a) {
      if (box.length[a] != 0 && global_offset[a] % box.length[a] != 0) {
        fail(
            fmt::format("on axis {} the offset {} is not a multiple of the local extent {}, "
                        "so the chunk is not on a regular grid; use from_global_offset for "
                        "irregular splits",
                        a, global_offset[a], box.length[a]));
      }
    }
  }
  if (replica_id.empty()) fail("replica_id is empty; use {0} for the main replica");
  for (int64_t r : replica_id) {
    if (r < 0) fail(fmt::format("replica_id {} has a negative entry", to_string(replica_id)));
  }
}

std::vector<ShardedTensor> ShardedTensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const auto local_ndim = static_cast<int64_t>(local_shape.size());
  if (dim < 0 || dim >= local_ndim) {
    throw ShardingError(
        fmt::format("ShardedTensor '{}': narrow dim {} is outside the {} local "
                    "dims of local_shape {}",
                    key, dim, local_ndim, to_string(local_shape)));
  }
  const auto d = static_cast<size_t>(dim);
  const size_t g = d + static_cast<size_t>(prepend_axis_num);
  const int64_t extent = local_shape[d];
  if (start < 0 || length < 0 || start + length > extent) {
    throw ShardingError(
        fmt::format("ShardedTensor '{}': narrow({}, {}, {}) leaves the local "
                    "extent {} of dim {}",
                    key, dim, start, length, extent, dim));
  }
  if (extent == 0 || global_shape[g] % extent != 0 || global_offset[g] % extent != 0) {
    throw ShardingError(
        fmt::format("ShardedTensor '{}': narrow needs a regular split along dim {}, but the global extent {} "
                    "and offset {} are not multiples of the local extent {}",
                    key, dim, global_shape[g], global_offset[g], extent));
  }
  if (flattened_range && dim != 0) {
    throw ShardingError(
        fmt::format("ShardedTensor '{}': a flattened tensor can only be narrowed "
                    "along dim 0, not dim {}",
                    key, dim));
  }

  ShardedTensor out = without_data();
  out.local_shape[d] = length;
  out.global_shape[g] = (global_shape[g] / extent) * length;
  out.global_offset[g] = (global_offset[g] / extent) * length;

  if (!flattened_range) {
    if (data.defined()) out.data = data.narrow(dim, start, length);
    out.validate_metadata_integrity();
    return {out};
  }
  // The narrowed rows are one flat interval of the chunk; keep what this rank
  // holds of it, re-based on the narrowed chunk.
  const int64_t row = numel(Shape(local_shape.begin() + 1, local_shape.end()));
  const int64_t lo = std::max(flattened_range->start, start * row);
  const int64_t hi = std::min(flattened_range->stop, (start + length) * row);
  if (hi <= lo) return {};
  out.flattened_range = FlatRange{lo - start * row, hi - start * row};
  if (data.defined()) {
    out.data = data.slice(0, lo - flattened_range->start, hi - flattened_range->start);
  }
  out.validate_metadata_integrity();
  return {out};
}

ShardedTensor ShardedTensor::without_data() const {
  ShardedTensor copy = *this;
  copy.data = at::Tensor();
  return copy;
}

Box ShardedTensor::global_box() const {
  Box box;
  box.offset = global_offset;
  box.length.assign(static_cast<size_t>(std::max<int64_t>(prepend_axis_num, 0)), 1);
  box.length.insert(box.length.end(), local_shape.begin(), local_shape.end());
  return box;
}

Shape ShardedTensor::local_chunk_offset_in_global() const {
  const Box box = global_box();
  Shape chunk(global_offset.size());
  for (size_t a = 0; a < chunk.size() && a < box.length.size(); ++a) {
    // An empty chunk has no grid position of its own; index 0 keeps it defined.
    chunk[a] = box.length[a] == 0 ? 0 : global_offset[a] / box.length[a];
  }
  return chunk;
}

int64_t ShardedTensor::held_numel() const { return flattened_range ? flattened_range->size() : numel(local_shape); }

std::string ShardedTensor::describe() const {
  const std::string flat =
      flattened_range ? fmt::format("[{}, {})", flattened_range->start, flattened_range->stop) : std::string("None");
  return fmt::format(
      "ShardedTensor(key='{}', dtype={}, local_shape={}, global_shape={}, global_offset={}, "
      "replica_id={}, flattened_range={})",
      key, dtype_label(dtype), to_string(local_shape), to_string(global_shape), to_string(global_offset),
      to_string(replica_id), flat);
}

std::vector<at::Tensor> ShardedTensor::local_coordinates() const {
  if (!flattened_range) {
    throw ShardingError(fmt::format(
        "ShardedTensor '{}': local_coordinates is defined only for a flat shard (flattened_range set); for a "
        "regular chunk every element of local_shape is held",
        key));
  }
  // Unravel the flat indices [start, stop) of the row-major local chunk, last axis first.
  at::Tensor index = at::arange(flattened_range->start, flattened_range->stop, at::kLong);
  std::vector<at::Tensor> coords(local_shape.size());
  for (size_t a = local_shape.size(); a-- > 0;) {
    coords[a] = index.remainder(local_shape[a]);
    index = index.div(local_shape[a], "floor");
  }
  return coords;
}

std::vector<at::Tensor> ShardedTensor::global_coordinates() const {
  const std::vector<at::Tensor> local = local_coordinates();
  const size_t prepend = static_cast<size_t>(prepend_axis_num);
  std::vector<at::Tensor> global;
  global.reserve(global_offset.size());
  for (size_t a = 0; a < global_offset.size(); ++a) {
    global.push_back(a < prepend ? at::full({flattened_range->size()}, global_offset[a], at::kLong)
                                 : local[a - prepend].add(global_offset[a]));
  }
  return global;
}

std::vector<at::indexing::TensorIndex> ShardedTensor::global_slice() const {
  const size_t prepend = static_cast<size_t>(prepend_axis_num);
  if (global_offset.size() != local_shape.size() + prepend) {
    throw ShardingError(fmt::format("ShardedTensor '{}': global_offset has {} axes, local_shape {} plus {} prepended",
                                    key, global_offset.size(), local_shape.size(), prepend));
  }
  std::vector<at::indexing::TensorIndex> slice;
  slice.reserve(global_offset.size());
  for (size_t a = 0; a < global_offset.size(); ++a) {
    if (a < prepend) {
      slice.emplace_back(global_offset[a]);
    } else {
      slice.emplace_back(at::indexing::Slice(global_offset[a], global_offset[a] + local_shape[a - prepend]));
    }
  }
  return slice;
}

Shape ShardedTensor::max_allowed_chunks() const {
  if (axis_fragmentations.size() != global_shape.size()) {
    throw ShardingError(
        fmt::format("ShardedTensor '{}': max_allowed_chunks needs the chunk grid (axis_fragmentations), which a "
                    "tensor placed by from_global_offset does not have",
                    key));
  }
  Shape chunks(global_shape.size());
  for (size_t a = 0; a < chunks.size(); ++a) {
    if (axis_fragmentations[a] <= 0) {
      throw ShardingError(fmt::format("ShardedTensor '{}': axis {} has {} fragments; it needs at least one", key, a,
                                      axis_fragmentations[a]));
    }
    if (!allow_shape_mismatch && global_shape[a] % axis_fragmentations[a] != 0) {
      throw ShardingError(fmt::format("ShardedTensor '{}': axis {} of length {} does not divide into {} fragments", key,
                                      a, global_shape[a], axis_fragmentations[a]));
    }
    chunks[a] = global_shape[a] / axis_fragmentations[a];
  }
  return chunks;
}

void ShardedTensor::init_data(at::Device target, const InitFn& init) {
  if (data.defined()) return;
  const Shape shape = flattened_range ? Shape{flattened_range->size()} : local_shape;
  const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(target);
  data = init ? init(shape, options) : at::empty(shape, options);
  device = target;
}

}  // namespace distckpt
