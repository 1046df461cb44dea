#include "distckpt/layout/builder.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "format/dtype.h"

namespace distckpt::layout {
namespace {

constexpr size_t kListed = 10;

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kListed; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kListed) out += fmt::format(" and {} more", names.size() - kListed);
  return out;
}

bool contains_axis(const std::vector<int>& axes, int axis) {
  return std::find(axes.begin(), axes.end(), axis) != axes.end();
}

using Parts = std::vector<std::pair<std::string, int64_t>>;

// A fused tensor's parts are each split like the whole, so the global tensor
// is [part0; part1; ...] whatever the split size. With a flat range (ZeRO),
// each part gets the piece of the range that falls in its rows; that needs
// the parts to be contiguous in the flattening, i.e. fused along dim 0.
ShardedTensorFactory::BuildFn fused_build(const ShardedTensor& base, const Parts& parts, int dim, int64_t rank,
                                          int64_t parts_count) {
  return [base, parts, dim, rank, parts_count](const std::string& key, const at::Tensor& local,
                                               const ReplicaId& replica, const std::optional<FlatRange>& flat) {
    if (flat && dim != 0) {
      throw UsageError(fmt::format("'{}': flat ranges of a fused tensor need it fused along dim 0, not {}", key, dim));
    }
    const int64_t inner = numel(base.local_shape) / std::max<int64_t>(base.local_shape[0], 1);
    Value pieces = Value::dict();
    int64_t global_start = 0, local_start = 0;
    for (const auto& [name, extent] : parts) {
      const int64_t local_extent = extent / parts_count;
      ShardedTensor piece = base;
      piece.key = key;
      piece.replica_id = replica;
      piece.local_shape[dim] = local_extent;
      piece.global_offset[base.prepend_axis_num + dim] = global_start + rank * local_extent;
      global_start += extent;
      if (!flat) {
        if (local.defined()) piece.data = local.narrow(dim, local_start, local_extent);
        pieces[name] = Value(std::move(piece));
        local_start += local_extent;
        continue;
      }
      const int64_t lo = local_start * inner, hi = (local_start + local_extent) * inner;
      local_start += local_extent;
      const int64_t start = std::max(lo, flat->start), stop = std::min(hi, flat->stop);
      if (start >= stop) continue;  // this part holds nothing of the range
      piece.flattened_range = FlatRange{start - lo, stop - lo};
      if (local.defined()) piece.data = local.slice(0, start - flat->start, stop - flat->start);
      pieces[name] = Value(std::move(piece));
    }
    return pieces;
  };
}

ShardedTensorFactory::MergeFn fused_merge(const Parts& parts, int dim) {
  return [parts, dim](const Value& loaded) {
    std::vector<at::Tensor> tensors;
    for (const auto& [name, extent] : parts) {
      if (loaded.contains(name)) tensors.push_back(loaded.at(name).as_tensor());
    }
    // Flat pieces are 1-D and in range order; whole parts concatenate along `dim`.
    return at::cat(tensors, tensors.front().dim() == 1 && parts.size() > 1 ? 0 : dim);
  };
}

}  // namespace

TensorSpec::TensorSpec(std::string schema_key_, Shape shape_)
    : schema_key(schema_key_), key(std::move(schema_key_)), shape(std::move(shape_)) {}

TensorSpec& TensorSpec::with_split(int dim, std::vector<int> axes) {
  splits.push_back(Split{dim, std::move(axes)});
  return *this;
}
TensorSpec& TensorSpec::with_pad(int dim) {
  pad_dim = dim;
  return *this;
}
TensorSpec& TensorSpec::with_fused_part(std::string name, int64_t extent) {
  fused.emplace_back(std::move(name), extent);
  return *this;
}
TensorSpec& TensorSpec::with_dtype(std::string dtype_name) {
  dtype = std::move(dtype_name);
  return *this;
}
TensorSpec& TensorSpec::stored_as(std::string stored_key) {
  key = std::move(stored_key);
  return *this;
}
TensorSpec& TensorSpec::tied_to(std::string stored_key) {
  key = std::move(stored_key);
  tied = true;
  return *this;
}
TensorSpec& TensorSpec::on_mesh(int index) {
  mesh = index;
  return *this;
}

std::string chunk_prefix(int64_t chunk) { return fmt::format("model{}.", chunk); }

int64_t exact_div(int64_t a, int64_t b, const char* expression) {
  if (b == 0 || a % b != 0) {
    throw UsageError(
        fmt::format("schema expression '{}' is {} / {}, not an exact division; fix the config", expression, a, b));
  }
  return a / b;
}

Position Position::within(int64_t index, int64_t count, int axis, const std::string& stack, bool stacked_axis) const {
  Position p = *this;
  if (stacked_axis) p.prepended.emplace_back(index, count);
  if (axis >= 0) p.placing_axes.push_back(axis);
  p.describe += fmt::format(" ({} {})", stack, index);
  return p;
}

Position Position::placed_on(int axis) const {
  Position p = *this;
  p.placing_axes.push_back(axis);
  return p;
}

int64_t ConfigChecker::required(const char* name, const std::optional<int64_t>& value) {
  if (!value) missing_.push_back(name);
  return value.value_or(0);
}

void ConfigChecker::done() const {
  if (missing_.empty()) return;
  throw UsageError(fmt::format("layout {}: config parameter{} {} must be set (the schema gives no default)",
                               layout_name_, missing_.size() == 1 ? "" : "s", list_names(missing_)));
}

size_t Builder::held(const std::optional<size_t>& slot, const char* key) const {
  if (slot) return *slot;
  throw UsageError(
      fmt::format("layout {}: '{}' is not held by this rank ({}): it lives on another stage or its condition "
                  "is off; check holds_...() first",
                  layout_name_, key, mesh_.describe()));
}

std::string MeshCoords::describe() const {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += fmt::format("{}{} {}/{}", i ? ", " : "", names[i], coords[i].rank, coords[i].size);
  }
  return out;
}

std::pair<int64_t, int64_t> Placement::range(int64_t stage, int64_t stages, const std::string& what) const {
  return chunk_ranges(stage, stages, what).front();
}

std::vector<std::pair<int64_t, int64_t>> Placement::chunk_ranges(int64_t stage, int64_t stages,
                                                                 const std::string& what) const {
  if (chunks < 1) throw UsageError(fmt::format("{}: {} virtual stages per stage; need at least 1", what, chunks));
  // Config values reach here unchecked (the generator checks only defaults).
  if (count < 0)
    throw UsageError(fmt::format("{}: {} elements; the count must not be negative (check the config)", what, count));
  const int64_t virtual_stages = stages * chunks;
  const std::string spread =
      chunks == 1 ? fmt::format("{} stages", stages) : fmt::format("{} stages x {} virtual stages", stages, chunks);
  std::vector<int64_t> sizes;
  if (!counts.empty()) {
    if (static_cast<int64_t>(counts.size()) != virtual_stages) {
      throw UsageError(
          fmt::format("{}: the pipeline layout gives {} counts but there are {}; give one count per virtual "
                      "stage, in virtual-stage order",
                      what, counts.size(), spread));
    }
    int64_t sum = 0;
    for (const int64_t n : counts) {
      if (n < 0) throw UsageError(fmt::format("{}: the pipeline layout has a negative count ({})", what, n));
      sum += n;
    }
    if (sum != count) {
      throw UsageError(fmt::format("{}: the pipeline layout places {} elements but there are {}", what, sum, count));
    }
    sizes = counts;
  } else if (first < 0 && last < 0) {
    if (count % virtual_stages != 0) {
      throw UsageError(
          fmt::format("{}: {} elements cannot be spread evenly over {}; declare first(n)/last(n) or an explicit "
                      "layout in the schema, or change the mesh",
                      what, count, spread));
    }
    sizes.assign(virtual_stages, count / virtual_stages);
  } else if (virtual_stages == 1) {
    sizes = {count};
  } else {
    const int64_t head = std::max<int64_t>(first, 0), tail = std::max<int64_t>(last, 0);
    const int64_t middle = virtual_stages - (first >= 0 ? 1 : 0) - (last >= 0 ? 1 : 0);
    const int64_t rest = count - head - tail;
    if (rest < 0 || (middle == 0 ? rest != 0 : rest % middle != 0)) {
      throw UsageError(
          fmt::format("{}: {} elements with {} on the first and {} on the last stage cannot be spread over {}", what,
                      count, head, tail, spread));
    }
    sizes.assign(virtual_stages, middle ? rest / middle : 0);
    if (first >= 0) sizes.front() = head;
    if (last >= 0) sizes.back() = tail;
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t v = 0; v < virtual_stages; ++v) {
    if (v % stages == stage) out.emplace_back(begin, begin + sizes[v]);
    begin += sizes[v];
  }
  return out;
}

Builder::Builder(std::string layout_name, MeshCoords mesh)
    : layout_name_(std::move(layout_name)), mesh_(std::move(mesh)) {
  for (size_t i = 0; i < mesh_.coords.size(); ++i) {
    const AxisCoord& c = mesh_.coords[i];
    if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
      throw UsageError(fmt::format("layout {}: mesh axis {} has rank {} of size {}; need 0 <= rank < size",
                                   layout_name_, mesh_.names[i], c.rank, c.size));
    }
  }
  if (mesh_.meshes.empty()) {
    MeshAxes all{"default", {}};
    for (size_t i = 0; i < mesh_.names.size(); ++i) all.axes.push_back(static_cast<int>(i));
    mesh_.meshes.push_back(std::move(all));
  }
  // Meshes are decompositions of the same ranks: each must span all of them.
  std::vector<std::string> spans;
  std::optional<int64_t> world;
  bool differ = false;
  for (const MeshAxes& m : mesh_.meshes) {
    int64_t ranks = 1;
    std::vector<std::string> factors;
    for (const int axis : m.axes) {
      ranks *= mesh_.coords.at(axis).size;
      factors.push_back(fmt::format("{} {}", mesh_.names[axis], mesh_.coords[axis].size));
    }
    spans.push_back(fmt::format("mesh {}: {} = {}", m.name, fmt::join(factors, " x "), ranks));
    differ = differ || (world && *world != ranks);
    world = ranks;
  }
  if (differ) {
    throw UsageError(
        fmt::format("layout {}: its meshes must cover the same ranks, but {}; choose axis sizes whose "
                    "products agree",
                    layout_name_, fmt::join(spans, ", ")));
  }
}

std::pair<int64_t, int64_t> Builder::split_coord(const Split& split) const {
  int64_t rank = 0, size = 1;
  for (int axis : split.axes) {
    rank = rank * mesh_.coords[axis].size + mesh_.coords[axis].rank;
    size *= mesh_.coords[axis].size;
  }
  return {rank, size};
}

size_t Builder::add_tensor(TensorSpec spec, Position position, std::string parameter_name) {
  if (spec.mesh < 0 || static_cast<size_t>(spec.mesh) >= mesh_.meshes.size()) {
    throw UsageError(fmt::format("layout {}: '{}' names mesh {} but the layout has {}", layout_name_, spec.schema_key,
                                 spec.mesh, mesh_.meshes.size()));
  }
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    if (spec.shape[d] < 0) {
      throw UsageError(
          fmt::format("layout {}: '{}' dim {} has extent {}; extents must not be negative (check the config)",
                      layout_name_, spec.schema_key, d, spec.shape[d]));
    }
  }
  for (const Split& s : spec.splits) {
    const int64_t parts = split_coord(s).second;
    if (spec.shape[s.dim] % parts != 0) {
      throw UsageError(fmt::format("layout {}: '{}' dim {} has extent {}, which {} does not divide ({})", layout_name_,
                                   spec.schema_key, s.dim, spec.shape[s.dim], parts, mesh_.describe()));
    }
  }
  if (!spec.fused.empty()) {
    const Split& s = spec.splits.front();
    const int64_t parts = split_coord(s).second;
    for (const auto& [name, extent] : spec.fused) {
      if (extent % parts != 0) {
        throw UsageError(fmt::format("layout {}: fused part '{}' of '{}' has extent {}, which {} does not divide",
                                     layout_name_, name, spec.schema_key, extent, parts));
      }
    }
  }
  by_parameter_[parameter_name] = tensors_.size();
  tensors_.push_back(TensorSlot{std::move(spec), std::move(position), std::move(parameter_name), {}});
  return tensors_.size() - 1;
}

size_t Builder::add_object(std::string key, std::vector<int> per_axes, Position position, std::string name, int mesh) {
  objects_.push_back(ObjectSlot{std::move(key), std::move(name), std::move(per_axes), std::move(position), mesh, {}});
  return objects_.size() - 1;
}

Builder::GroupCoord Builder::group_coord(const Distribution& distribution) const {
  int64_t rank = 0, size = 1;
  for (const int axis : distribution.axes) {
    rank = rank * mesh_.coords.at(axis).size + mesh_.coords[axis].rank;
    size *= mesh_.coords[axis].size;
  }
  if (distribution.instances < 1 || size % distribution.instances != 0) {
    throw UsageError(
        fmt::format("layout {}: the distributed optimizer's group has {} ranks ({}), which {} instances do "
                    "not divide",
                    layout_name_, size, mesh_.describe(), distribution.instances));
  }
  const int64_t shards = size / distribution.instances;
  return GroupCoord{rank % shards, shards, rank / shards};
}

std::vector<std::optional<FlatRange>> Builder::distributed_ranges(const Distribution& distribution) const {
  const GroupCoord group = group_coord(distribution);
  int64_t total = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].spec.mesh == distribution.mesh) total += numel(local_shape(i));
  }
  const int64_t align = group.shards * kDistributedBucketAlign;
  const int64_t per_rank = (total + align - 1) / align * align / group.shards;
  const int64_t lo = group.shard * per_rank, hi = lo + per_rank;
  std::vector<std::optional<FlatRange>> out(tensors_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].spec.mesh != distribution.mesh) continue;
    const int64_t n = numel(local_shape(i));
    const int64_t start = std::max(lo, offset), stop = std::min(hi, offset + n);
    if (start < stop) out[i] = FlatRange{start - offset, stop - offset};
    offset += n;
  }
  return out;
}

Shape Builder::local_shape(size_t slot) const {
  const TensorSpec& spec = tensors_.at(slot).spec;
  Shape shape = spec.shape;
  for (const Split& s : spec.splits) shape[s.dim] /= split_coord(s).second;
  return shape;
}

void Builder::set_tensor(size_t slot, at::Tensor tensor) {
  TensorSlot& t = tensors_.at(slot);
  const Shape want = local_shape(slot);
  if (!tensor.defined() || Shape(tensor.sizes().begin(), tensor.sizes().end()) != want) {
    throw ShardingError(
        fmt::format("layout {}: '{}'{} expects a local tensor of shape {} on this rank ({}), got {}", layout_name_,
                    t.spec.schema_key, t.position.describe, to_string(want), mesh_.describe(),
                    tensor.defined() ? to_string(Shape(tensor.sizes().begin(), tensor.sizes().end())) : "no tensor"));
  }
  if (!t.spec.dtype.empty() && dtype_name(tensor.scalar_type()) != t.spec.dtype) {
    throw ShardingError(fmt::format("layout {}: '{}'{} is declared {} but the tensor is {}", layout_name_,
                                    t.spec.schema_key, t.position.describe, t.spec.dtype,
                                    dtype_name(tensor.scalar_type())));
  }
  t.data = std::move(tensor);
}

void Builder::set_object(size_t slot, std::string bytes) { objects_.at(slot).data = std::move(bytes); }
void Builder::set_common(const std::string& key, Value value) { common_[key] = std::move(value); }
void Builder::set_transient(const std::string& key, Value value) { transient_[key] = std::move(value); }

void Builder::bind(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                   const std::vector<std::pair<std::string, std::string>>& name_map, const std::string& prefix) {
  std::vector<std::string> unknown;
  for (const auto& [name, tensor] : named_parameters) {
    std::string mapped = name;
    for (const auto& [module_prefix, schema_prefix] : name_map) {
      if (name.rfind(module_prefix, 0) == 0) {
        mapped = schema_prefix + name.substr(module_prefix.size());
        break;
      }
    }
    mapped = prefix + mapped;
    auto it = by_parameter_.find(mapped);
    if (it == by_parameter_.end()) {
      unknown.push_back(mapped == name ? name : fmt::format("{} (mapped to {})", name, mapped));
      continue;
    }
    set_tensor(it->second, tensor);
  }
  if (!unknown.empty()) {
    throw UsageError(
        fmt::format("layout {}: {} module parameter(s) match no tensor this rank holds ({}): {}. Declare them "
                    "in the schema or map their names",
                    layout_name_, unknown.size(), mesh_.describe(), list_names(unknown)));
  }
}

void Builder::bind_chunk(int64_t chunk, int64_t chunks,
                         const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                         const std::vector<std::pair<std::string, std::string>>& name_map) {
  if (chunk < 0 || chunk >= chunks) {
    throw UsageError(fmt::format("layout {}: model chunk {} does not exist; this rank holds chunks 0..{} ({})",
                                 layout_name_, chunk, chunks - 1, mesh_.describe()));
  }
  bind(named_parameters, name_map, chunk_prefix(chunk));
}

ReplicaId Builder::replica_id(const std::vector<int>& not_replicating, bool tied, int mesh, int64_t instance) const {
  ReplicaId id;
  if (tied) id.push_back(1);
  if (instance >= 0) id.push_back(instance);
  for (const int axis : mesh_.meshes.at(mesh).axes) {
    if (!contains_axis(not_replicating, axis)) id.push_back(mesh_.coords[axis].rank);
  }
  if (id.empty()) id.push_back(0);
  return id;
}

Value Builder::entry(const TensorSlot& slot, bool with_data, at::ScalarType default_dtype) const {
  const at::ScalarType dtype = slot.data.defined()
                                   ? slot.data.scalar_type()
                                   : (slot.spec.dtype.empty() ? default_dtype : dtype_from_name(slot.spec.dtype));
  return make_entry(slot, slot.spec.key, with_data ? slot.data : at::Tensor(), dtype, std::nullopt, nullptr);
}

Value Builder::derived_entry(size_t slot, const std::string& key_prefix, at::Tensor data, std::optional<FlatRange> flat,
                             const Distribution* distribution) const {
  const TensorSlot& t = tensors_.at(slot);
  const at::ScalarType dtype = data.defined() ? data.scalar_type() : t.data.scalar_type();
  return make_entry(t, key_prefix + "." + t.spec.key, std::move(data), dtype, flat, distribution);
}

Value Builder::make_entry(const TensorSlot& slot, const std::string& key, at::Tensor data, at::ScalarType dtype,
                          std::optional<FlatRange> flat, const Distribution* distribution) const {
  const TensorSpec& spec = slot.spec;
  const auto prepend = static_cast<int64_t>(slot.position.prepended.size());
  ShardedTensor base;
  base.key = key;
  base.dtype = dtype;
  base.local_shape = local_shape(static_cast<size_t>(&slot - tensors_.data()));
  base.prepend_axis_num = prepend;
  // Padding may change between save and load (flat ranges too: each piece is padded or truncated).
  base.allow_shape_mismatch = spec.pad_dim.has_value();
  std::vector<int> not_replicating = slot.position.placing_axes;
  int64_t instance = -1;
  if (distribution) {
    not_replicating.insert(not_replicating.end(), distribution->axes.begin(), distribution->axes.end());
    if (distribution->instances > 1) instance = group_coord(*distribution).instance;
  }
  for (const auto& [index, count] : slot.position.prepended) {
    base.global_shape.push_back(count);
    base.global_offset.push_back(index);
  }
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    base.global_shape.push_back(spec.shape[d]);
    base.global_offset.push_back(0);
  }
  for (const Split& s : spec.splits) {
    base.global_offset[prepend + s.dim] = split_coord(s).first * base.local_shape[s.dim];
    not_replicating.insert(not_replicating.end(), s.axes.begin(), s.axes.end());
  }
  base.replica_id = replica_id(not_replicating, spec.tied, spec.mesh, instance);

  if (spec.fused.empty()) {
    base.data = std::move(data);
    base.flattened_range = flat;
    base.validate_metadata_integrity();
    return Value(std::move(base));
  }
  ShardedTensorFactory factory;
  factory.key = key;
  factory.data = std::move(data);
  factory.replica_id = base.replica_id;
  factory.flattened_range = flat;
  const auto [rank, parts_count] = split_coord(spec.splits.front());
  factory.build = fused_build(base, spec.fused, spec.splits.front().dim, rank, parts_count);
  factory.merge = fused_merge(spec.fused, spec.splits.front().dim);
  return Value(std::move(factory));
}

Value Builder::build(bool with_data, at::ScalarType default_dtype) const {
  if (with_data) {
    std::vector<std::string> missing;
    for (const TensorSlot& t : tensors_) {
      if (!t.data.defined()) missing.push_back(t.parameter_name);
    }
    for (const ObjectSlot& o : objects_) {
      if (!o.data) missing.push_back(o.name);
    }
    if (!missing.empty()) {
      throw UsageError(fmt::format(
          "layout {}: cannot build the state dict, {} declared entr{} not set on this rank ({}): {}", layout_name_,
          missing.size(), missing.size() == 1 ? "y is" : "ies are", mesh_.describe(), list_names(missing)));
    }
  }
  StateDict sd = Value::dict();
  for (const TensorSlot& t : tensors_) sd[t.parameter_name] = entry(t, with_data, default_dtype);
  for (const ObjectSlot& o : objects_) {
    ShardedObject object;
    object.key = o.key;
    object.data = with_data ? *o.data : std::string();
    std::vector<int> not_replicating = o.position.placing_axes;
    for (const auto& [index, count] : o.position.prepended) {
      object.global_shape.push_back(count);
      object.global_offset.push_back(index);
    }
    for (int axis : o.per_axes) {
      object.global_shape.push_back(mesh_.coords[axis].size);
      object.global_offset.push_back(mesh_.coords[axis].rank);
      not_replicating.push_back(axis);
    }
    if (object.global_shape.empty()) {
      object.global_shape = {1};
      object.global_offset = {0};
    }
    object.replica_id = replica_id(not_replicating, false, o.mesh);
    sd[o.name] = Value(std::move(object));
  }
  for (const auto& [key, value] : common_) sd[key] = value;
  for (const auto& [key, value] : transient_) sd[key] = LocalNonPersistentObject(value);
  return sd;
}

StateDict Builder::state_dict() const { return build(true, at::kFloat); }
StateDict Builder::metadata_state_dict(at::ScalarType default_dtype) const { return build(false, default_dtype); }

}  // namespace distckpt::layout
