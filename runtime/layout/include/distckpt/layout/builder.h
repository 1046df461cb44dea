// GENERATED-CODE SUPPORT: called by the code distckpt-gen emits, not meant to
// be called directly; it changes together with the generator (generated
// headers check the runtime version for that reason).
//
// Runtime support for code generated from a layout schema. The generated
// Model class resolves the schema's expressions with the trainer's config,
// declares one slot per tensor/object this rank may hold, and forwards its
// typed setters here. This class knows the sharding rules: local shapes,
// global offsets, prepended (stacked) axes, replica ids, fused factories.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/api/options.h"
#include "distckpt/core/state_dict.h"

namespace distckpt::layout {

// This rank's coordinate on one mesh axis.
struct AxisCoord {
  int64_t rank = 0;
  int64_t size = 1;
};

// One mesh over the job's ranks: its name and axes (indices into
// MeshCoords::names). MoE parallel folding lays dense tensors over one mesh
// (tp, cp, dp, pp) and experts over another (etp, ep, edp, pp) of the same
// ranks; axes with the same name are the same axis.
struct MeshAxes {
  std::string name;
  std::vector<int> axes;
};

struct MeshCoords {
  MeshCoords(std::vector<std::string> names_, std::vector<AxisCoord> coords_, std::vector<MeshAxes> meshes_ = {})
      : names(std::move(names_)), coords(std::move(coords_)), meshes(std::move(meshes_)) {}

  std::vector<std::string> names;  // every axis of every mesh, schema order
  std::vector<AxisCoord> coords;
  std::vector<MeshAxes> meshes;  // empty: one mesh of every axis
  std::string describe() const;  // "tp 1/2, pp 0/4, dp 0/1"
};

// How many elements of a stack each stage of its axis holds. With `chunks`
// virtual stages per stage (interleaved pipelines) there are stages x chunks
// virtual stages, virtual stage v being chunk v / stages of stage
// v % stages, and elements go to virtual stages in order (Megatron's
// assignment): `counts` gives each virtual stage's share explicitly, else
// `first`/`last` elements go to the first/last virtual stage and the rest
// evenly.
struct Placement {
  explicit Placement(int64_t count_, int64_t first_ = -1, int64_t last_ = -1, int64_t chunks_ = 1,
                     std::vector<int64_t> counts_ = {})
      : count(count_), first(first_), last(last_), chunks(chunks_), counts(std::move(counts_)) {}

  int64_t count = 0;
  int64_t first = -1;  // -1: even
  int64_t last = -1;
  int64_t chunks = 1;
  std::vector<int64_t> counts;  // per virtual stage; empty: first/last/even
  // [begin, end) of the global indices held by `stage` of `stages` (one
  // chunk); throws UsageError when the counts cannot be spread that way.
  std::pair<int64_t, int64_t> range(int64_t stage, int64_t stages, const std::string& what) const;
  // The same for each of the stage's chunks, in chunk order.
  std::vector<std::pair<int64_t, int64_t>> chunk_ranges(int64_t stage, int64_t stages, const std::string& what) const;
};

// The parameter-name prefix of model chunk `chunk` in a layout with virtual
// pipeline stages ("model0.", "model1.", as Megatron names its chunks).
std::string chunk_prefix(int64_t chunk);

// ZeRO-1 over a group of one mesh's axes (major first): `instances`
// consecutive sub-groups each shard the state, which is replicated across
// them (Megatron's num_distributed_optimizer_instances).
struct Distribution {
  int mesh = 0;
  std::vector<int> axes;
  int64_t instances = 1;
};

struct Split {
  int dim = 0;
  std::vector<int> axes;  // major first
};

// A tensor declaration with every expression evaluated. Generated code
// builds it fluently:
//   TensorSpec("mlp.linear_fc1.weight", {2 * ffn, hidden}).with_split(0, {kTp}).with_fused_part("w", ffn)
struct TensorSpec {
  TensorSpec(std::string schema_key, Shape shape);
  TensorSpec& with_split(int dim, std::vector<int> axes);
  TensorSpec& with_pad(int dim);
  TensorSpec& with_fused_part(std::string name, int64_t extent);
  TensorSpec& with_dtype(std::string dtype_name);
  // Stored under another key: `as keys` stacks (element indices in the key).
  TensorSpec& stored_as(std::string key);
  // Stored under `key` as a non-main replica of that tensor (tied weights).
  TensorSpec& tied_to(std::string key);
  // Lives on mesh `index` of MeshCoords::meshes (replicated over its axes only).
  TensorSpec& on_mesh(int index);

  std::string schema_key;  // as declared, for messages ("decoder.layers.mlp.linear_fc1.weight")
  std::string key;         // checkpoint key
  Shape shape;             // global shape of one element
  std::vector<Split> splits;
  std::optional<int> pad_dim;
  std::vector<std::pair<std::string, int64_t>> fused;  // part name -> global extent along splits[0].dim
  bool tied = false;
  std::string dtype;  // "" = any
  int mesh = 0;
};

// Exact integer division for schema expressions; throws UsageError naming the
// expression ("hidden / heads") when it does not divide.
int64_t exact_div(int64_t a, int64_t b, const char* expression);

// Where one stack element sits. For `as axis` stacks, each level adds a
// prepended axis (global index, count); placing axes never replicate.
struct Position {
  std::vector<std::pair<int64_t, int64_t>> prepended;
  std::vector<int> placing_axes;
  std::string describe;  // " (decoder.layers 3)" suffix for messages ("" at top level)

  // Element `index` of `count` of stack `stack`, spread over `axis` (-1: a
  // stack placed whole on one stage); with `stacked_axis` the index becomes a
  // prepended axis of every tensor.
  Position within(int64_t index, int64_t count, int axis, const std::string& stack, bool stacked_axis) const;
  // Placed by `axis` (a stage(first|last) tensor): not replicated over it.
  Position placed_on(int axis) const;
};

// Collects required config parameters; done() throws one UsageError naming all
// that are missing.
class ConfigChecker {
 public:
  explicit ConfigChecker(std::string layout_name) : layout_name_(std::move(layout_name)) {}
  int64_t required(const char* name, const std::optional<int64_t>& value);
  void done() const;

 private:
  std::string layout_name_;
  std::vector<std::string> missing_;
};

class Builder {
 public:
  Builder(std::string layout_name, MeshCoords mesh);

  // Declares a tensor slot; `parameter_name` is the module parameter name it
  // binds to (local stack indices, like LibTorch module names).
  size_t add_tensor(TensorSpec spec, Position position, std::string parameter_name);
  size_t add_object(std::string key, std::vector<int> per_axes, Position position, std::string name, int mesh = 0);

  // `slot` if this rank holds the entry; otherwise a UsageError naming `key`.
  size_t held(const std::optional<size_t>& slot, const char* key) const;
  // The local shape this rank must hold for a slot.
  Shape local_shape(size_t slot) const;
  // Checks shape (and dtype if declared) against the schema; the message names the key.
  void set_tensor(size_t slot, at::Tensor tensor);
  void set_object(size_t slot, std::string bytes);
  // For generated setters: the slot if this rank holds it, else a UsageError naming `key`.
  void set_tensor(const std::optional<size_t>& slot, const char* key, at::Tensor tensor) {
    set_tensor(held(slot, key), std::move(tensor));
  }
  void set_object(const std::optional<size_t>& slot, const char* key, std::string bytes) {
    set_object(held(slot, key), std::move(bytes));
  }
  void set_common(const std::string& key, Value value);
  void set_transient(const std::string& key, Value value);

  // Fills tensor slots from module parameters: `name_map` pairs (module
  // prefix, schema prefix) rename parameters first (first match wins), then
  // `prefix` (a model chunk's) goes in front. Unknown names are errors that
  // list them.
  void bind(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
            const std::vector<std::pair<std::string, std::string>>& name_map, const std::string& prefix = "");
  // bind() for model chunk `chunk` of `chunks` (its chunk_prefix in front).
  void bind_chunk(int64_t chunk, int64_t chunks,
                  const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                  const std::vector<std::pair<std::string, std::string>>& name_map);

  // ---- optimizer state laid out like the parameters -------------------
  static constexpr int64_t kDistributedBucketAlign = 128;  // elements per rank
  // ZeRO-1: the flat range of each tensor slot of the distribution's mesh
  // this rank owns. Those slots are concatenated in declaration order, the
  // total padded to a multiple of (shards * kDistributedBucketAlign)
  // elements, and shard s owns the s-th equal part, where the group's ranks
  // (its axes' coordinates, major first) are split into `instances`
  // consecutive sub-groups of `shards` ranks. nullopt: nothing of that slot.
  std::vector<std::optional<FlatRange>> distributed_ranges(const Distribution& distribution) const;
  // An entry sharded like `slot` for `data` (shaped like the slot's local
  // tensor, or the `flat` range of it), keyed `key_prefix + "." + key`. Ranks
  // of the `distribution`'s group (null: none) hold different data, so it
  // replicates only across its instances.
  Value derived_entry(size_t slot, const std::string& key_prefix, at::Tensor data, std::optional<FlatRange> flat,
                      const Distribution* distribution) const;
  int slot_mesh(size_t slot) const { return tensors_.at(slot).spec.mesh; }
  size_t tensor_slot_count() const { return tensors_.size(); }
  const std::string& parameter_name(size_t slot) const { return tensors_.at(slot).parameter_name; }
  const at::Tensor& bound_tensor(size_t slot) const { return tensors_.at(slot).data; }

  // Throws UsageError listing every declared tensor/object this rank has not set.
  StateDict state_dict() const;
  // The same entries without data: what to pass to load() without a model.
  // Tensors whose schema declares no dtype are requested as `default_dtype`.
  StateDict metadata_state_dict(at::ScalarType default_dtype = at::kFloat) const;

  const MeshCoords& mesh() const { return mesh_; }

 private:
  struct TensorSlot {
    TensorSpec spec;
    Position position;
    std::string parameter_name;
    at::Tensor data;
  };
  struct ObjectSlot {
    std::string key;
    std::string name;
    std::vector<int> per_axes;
    Position position;
    int mesh = 0;
    std::optional<std::string> data;
  };
  // (shard rank, shards, instance) of this rank in a distribution's group.
  struct GroupCoord {
    int64_t shard = 0, shards = 1, instance = 0;
  };
  GroupCoord group_coord(const Distribution& distribution) const;
  Value entry(const TensorSlot& slot, bool with_data, at::ScalarType default_dtype) const;
  Value make_entry(const TensorSlot& slot, const std::string& key, at::Tensor data, at::ScalarType dtype,
                   std::optional<FlatRange> flat, const Distribution* distribution) const;
  // Coordinates on `mesh`'s axes outside `not_replicating`, after a 1 for a
  // tied copy and the `instance` (>= 0) of a distributed optimizer.
  ReplicaId replica_id(const std::vector<int>& not_replicating, bool tied, int mesh, int64_t instance = -1) const;
  std::pair<int64_t, int64_t> split_coord(const Split& split) const;  // (rank, size) over the product of axes
  Value build(bool with_data, at::ScalarType default_dtype) const;

  std::string layout_name_;
  MeshCoords mesh_;
  std::vector<TensorSlot> tensors_;
  std::vector<ObjectSlot> objects_;
  std::map<std::string, size_t> by_parameter_;
  Dict common_;
  Dict transient_;
};

}  // namespace distckpt::layout
