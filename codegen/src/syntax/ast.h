// The syntax tree of a layout schema, exactly as written: names are still
// text, nothing is resolved or checked. Every node keeps its source position
// so the checker can point at the precise token it complains about.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ir/ir.h"

namespace distckpt::gen::ast {

// An identifier or a dotted name ("decoder.layers"), at its first character.
struct Name {
  std::string text;
  Loc loc;
};

struct Int {
  int64_t value = 0;
  Loc loc;
};

struct Expr {
  enum class Kind { kInt, kName, kBinary };
  Kind kind = Kind::kInt;
  int64_t value = 0;  // kInt
  std::string name;   // kName: a config parameter, unresolved
  char op = 0;        // kBinary: '+', '-', '*' or '/'
  std::unique_ptr<Expr> lhs, rhs;
  Loc loc;        // first token: the left operand's for kBinary, or its '(' when parenthesized
  int depth = 1;  // of the tree: bounded by the parser, since every later pass recurses
};
using ExprPtr = std::unique_ptr<Expr>;

// `when P` / `unless P`.
struct Condition {
  bool negate = false;  // `unless`
  Name param;
  Loc loc;  // the `when` / `unless` keyword
};

// `D by a * b` inside split(...).
struct Split {
  Int dim;
  std::vector<Name> axes;
};

struct Stage {
  bool last = false;
  Loc loc;  // the `stage` keyword
};

struct FusedPart {
  Name name;
  ExprPtr extent;
};

struct Fused {
  std::vector<FusedPart> parts;
  Loc loc;  // the `fused` keyword
};

// Attributes that may appear at most once are still kept as lists so the
// checker can report the repetition instead of the parser dropping it.
struct Tensor {
  Loc loc;  // the `tensor` keyword
  Name key;
  std::vector<ExprPtr> shape;
  std::vector<Split> splits;  // from every split(...) attribute, in order
  std::vector<Int> pads;
  std::vector<Stage> stages;
  std::vector<Fused> fused;
  std::vector<Name> tied;
  std::vector<Name> dtypes;
  std::vector<Name> meshes;  // `on MESH`
  std::optional<Condition> condition;
};

struct Object {
  Loc loc;  // the `object` keyword
  Name key;
  std::vector<Name> per_axes;
  std::optional<Name> mesh;  // `on MESH`
  std::optional<Condition> condition;
};

struct Stack;
using BlockItem = std::variant<Tensor, Object, std::unique_ptr<Stack>>;

struct Storage {
  bool as_keys = false;
  Loc loc;  // the `axis` / `keys` word
};

struct Stack {
  Loc loc;  // the `stack` keyword
  Name key;
  ExprPtr count;
  Name axis;                   // empty text for a stack placed by stage(...)
  std::optional<Stage> stage;  // `stage(first|last)` instead of `over AXIS`
  ExprPtr chunks;              // virtual(n), null when absent
  Loc chunks_loc;              // the `virtual` keyword
  std::optional<Name> layout;  // layout(PARAM): explicit elements per virtual stage
  ExprPtr first_count;         // first(n), null when absent
  ExprPtr last_count;          // last(m), null when absent
  std::optional<Name> mesh;    // `on MESH`
  std::optional<Storage> storage;
  std::optional<Condition> condition;
  std::vector<BlockItem> body;
};

struct LayoutDecl {
  Loc loc;  // the `layout` keyword
  Name name;
};

struct Param {
  Name name;
  bool list = false;  // `int[]`
  ExprPtr default_value;
};

struct Config {
  Loc loc;  // the `config` keyword
  std::vector<Param> params;
};

struct Mesh {
  Loc loc;                   // the `mesh` keyword
  std::optional<Name> name;  // `mesh NAME: ...`; the unnamed mesh is the default one
  std::vector<Name> axes;
};

struct Common {
  Loc loc;
  Name key;
  CommonDecl::Type type = CommonDecl::Type::kInt;
};

struct Transient {
  Loc loc;
  Name key;
};

struct Optimizer {
  Loc loc;  // the `optimizer` keyword
  Name name;
  std::vector<Name> states;
  std::vector<Name> scalars;
  // `distributed over a * b instances(n) on MESH;`
  struct Distributed {
    Loc loc;  // the `distributed` keyword
    std::vector<Name> axes;
    ExprPtr instances;  // null when absent
    std::optional<Name> mesh;
  };
  std::vector<Distributed> distributed;  // more than one per mesh is an error
};

// A schema key in a mapping, with the index names bound to its stacks:
// `decoder.layers[layer].mlp.linear_fc1.weight` has text
// "decoder.layers.mlp.linear_fc1.weight" and one index "layer" bound after
// "decoder.layers" (prefix length 14).
struct MapIndex {
  Name name;
  size_t prefix = 0;  // length of the key text before the '['
};

struct MapKey {
  std::string text;
  std::vector<MapIndex> indices;
  Loc loc;
};

// `= "external"` for the whole tensor, or `PART = "external"` in a block.
struct MapTarget {
  std::optional<Name> part;
  std::string external;
  Loc loc;  // the string literal
};

struct MapEntry {
  MapKey key;
  bool whole = true;  // `KEY = "...";` rather than `KEY { part = "..."; }`
  std::vector<MapTarget> targets;
};

struct Mapping {
  Loc loc;  // the `mapping` keyword
  Name name;
  std::vector<MapEntry> entries;
  std::vector<Name> skips;  // `skip KEY;`
};

using Item = std::variant<LayoutDecl, Config, Mesh, Tensor, Object, std::unique_ptr<Stack>, Common, Transient,
                          Optimizer, Mapping>;

struct Schema {
  std::vector<Item> items;  // in source order
};

}  // namespace distckpt::gen::ast
