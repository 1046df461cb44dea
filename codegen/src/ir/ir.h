// The layout model: a checked schema with every name resolved. The checker
// builds it from the syntax tree; the emitter turns it into C++. Expressions
// stay symbolic because config values are only known when the trainer runs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace distckpt::gen {

struct Loc {
  int line = 0;  // 1-based
  int col = 0;   // 1-based
};

// Integer expression over config parameters.
struct Expr {
  enum class Op { kConst, kParam, kAdd, kSub, kMul, kDiv };
  Op op = Op::kConst;
  int64_t value = 0;  // kConst
  int param = -1;     // kParam: index into Layout::params
  std::shared_ptr<const Expr> lhs, rhs;
  Loc loc;
};
using ExprPtr = std::shared_ptr<const Expr>;

struct ConfigParam {
  std::string name;
  ExprPtr default_value;  // null: the trainer must set it (lists: empty)
  Loc loc;
  bool list = false;  // `int[]`: a list, used only by layout(...); empty when not set
};

// `mesh NAME: a, b, c;`: one decomposition of the job's ranks. Meshes share
// the axes they both name; the first mesh is the default one.
struct MeshDecl {
  std::string name;       // "default" for the unnamed mesh
  std::vector<int> axes;  // into Layout::mesh_axes, in declaration order
  Loc loc;
};

// Exists only when config parameter `param` is non-zero (or zero, negated).
struct Condition {
  int param = -1;  // -1: always
  bool negate = false;
};

struct Split {
  int dim = 0;
  std::vector<int> axes;  // indices into Layout::mesh_axes, major first
};

struct FusedPart {
  std::string name;
  ExprPtr extent;  // global extent along the split dim
};

enum class Stage { kAll, kFirst, kLast };

struct TensorDecl {
  std::string key;             // dotted, relative to the enclosing stack ("self_attention.linear_qkv.weight")
  std::vector<ExprPtr> shape;  // global shape of one element (without stacked axes)
  std::vector<Split> splits;
  std::optional<int> pad_dim;
  Stage stage = Stage::kAll;
  int stage_axis = -1;           // the axis `stage` refers to (the layer-stacking axis)
  std::vector<FusedPart> fused;  // empty: a plain tensor
  std::string tied_key;          // full key of the main copy; empty: not tied
  std::string dtype;             // "" = any, else a distckpt dtype name ("bfloat16")
  int mesh = 0;                  // into Layout::meshes
  Condition condition;
  std::string accessor;  // C++ name: "self_attention_linear_qkv_weight"
  Loc loc;
};

struct ObjectDecl {
  std::string key;
  std::vector<int> per_axes;
  int mesh = 0;
  Condition condition;
  std::string accessor;
  Loc loc;
};

struct StackDecl;

// Declaration order inside a block (it fixes the order of ZeRO flat ranges).
struct Member {
  enum class Kind { kTensor, kObject, kStack };
  Kind kind;
  size_t index;  // into the block's vector of that kind
};

struct Block {
  std::vector<TensorDecl> tensors;
  std::vector<ObjectDecl> objects;
  std::vector<std::shared_ptr<StackDecl>> stacks;
  std::vector<Member> order;
};

struct StackDecl {
  std::string key;            // "decoder.layers"
  ExprPtr count;              // global number of elements
  int axis = -1;              // mesh axis the elements are spread over; -1: placed whole by `stage`
  Stage stage = Stage::kAll;  // stage(first|last): every element on that (virtual) stage
  int stage_axis = -1;        // the layer axis `stage` refers to
  ExprPtr chunks;             // virtual(n): virtual stages per stage (null = 1, no model chunks)
  int layout_param = -1;      // layout(P): the list parameter giving elements per virtual stage
  ExprPtr first_count;        // uneven placement: elements on the first stage (null = even)
  ExprPtr last_count;         // elements on the last stage (null = even)
  bool as_keys = false;       // one key per element instead of a stacked leading axis
  int mesh = 0;               // the mesh of the body's members
  Condition condition;
  Block body;
  std::string accessor;    // "decoder_layers"
  std::string class_name;  // of the element class, from the full key: "DecoderLayers", "DecoderLayersMlpExperts"
  Loc loc;
};

struct CommonDecl {
  enum class Type { kInt, kFloat, kString, kBool };
  std::string key;
  Type type = Type::kInt;
  std::string accessor;
  Loc loc;
};

struct TransientDecl {
  std::string key;
  std::string accessor;
  Loc loc;
};

struct OptimizerDecl {
  std::string name;                  // "adam"
  std::string class_name;            // "Adam"
  std::vector<std::string> states;   // "exp_avg", "exp_avg_sq"
  std::vector<std::string> scalars;  // "step"
  // `distributed over a * b instances(n) on MESH`: ZeRO-1 per mesh.
  struct Distribution {
    int mesh = 0;
    std::vector<int> axes;  // major first
    ExprPtr instances;      // null: 1
    Loc loc;
  };
  std::vector<Distribution> distributions;  // at most one per mesh
  Loc loc;
};

// One line of a `mapping` block, resolved against one declaration of its
// key: the external tensors it names (one per combination of its indices).
struct MapIndex {
  std::string name;   // "layer"
  ExprPtr count;      // the stack's element count
  bool leading_axis;  // the stack stores a leading axis (else one key per element)
};

struct MappedTensor {
  std::string key;                // checkpoint key; "{layer}" where a stack stores one key per element
  std::string external;           // external name template: "model.layers.{layer}.self_attn.q_proj.weight"
  std::vector<MapIndex> indices;  // outermost stack first
  std::vector<ExprPtr> shape;     // one element's global shape
  int part_dim = -1;              // a fused part's dim; -1: the whole tensor
  ExprPtr part_offset, part_extent;
  std::optional<int> pad_dim;
  std::vector<Condition> conditions;  // the declaration's own and its stacks'
  std::string source;                 // the mapping line, for the comment above it
  Loc loc;
};

struct MappingDecl {
  std::string name;      // "llama"
  std::string function;  // "llama_mapping"
  std::vector<MappedTensor> tensors;
  Loc loc;
};

struct Layout {
  std::string name;         // from `layout NAME;`
  std::string file_name;    // as given on the command line (for messages)
  std::string source_text;  // the schema, embedded in generated code
  std::vector<ConfigParam> params;
  std::vector<std::string> mesh_axes;  // every axis of every mesh, in order of first declaration
  std::vector<MeshDecl> meshes;
  // The stack with virtual(n): the Model then holds n model chunks per stage
  // and parameter names carry the chunk ("model0.", ...). Null: no chunks.
  const StackDecl* chunked_stack = nullptr;
  Block body;
  std::vector<CommonDecl> commons;
  std::vector<TransientDecl> transients;
  std::vector<OptimizerDecl> optimizers;
  std::vector<MappingDecl> mappings;
};

}  // namespace distckpt::gen
