// What the checker passes share: the layout being built, the name tables
// (config parameters, mesh axes, checkpoint keys) and the helpers that
// resolve names and evaluate expressions while reporting what is wrong.
// Each pass lives in its own file; checker.cpp runs them in order.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "diagnostics.h"
#include "ir/ir.h"
#include "syntax/ast.h"

namespace distckpt::gen {

// A stack around the declaration being checked.
struct EnclosingStack {
  std::string key;  // full key
  int axis = -1;
};

// Where a declaration sits: the prefix of its full key, the stacks around
// it (outermost first) and the conditions those stacks add.
struct Scope {
  std::string key_prefix;  // "decoder.layers." inside that stack
  std::vector<EnclosingStack> stacks;
  std::vector<Condition> conditions;
  int mesh = 0;  // the mesh members live on unless they say `on MESH`

  bool top_level() const { return stacks.empty(); }
  // The enclosing stack spread over `axis`, or nullptr.
  const EnclosingStack* stack_over(int axis) const;
};

// One declaration of a full checkpoint key.
struct KeyUse {
  Loc loc;
  std::vector<Condition> conditions;  // its own and its stacks'
  bool tensor = false;
  bool tied = false;
  size_t rank = 0;
  std::vector<ExprPtr> shape;  // a tensor's (one element's)
};

// A tied(KEY) to resolve once every tensor is known.
struct PendingTie {
  ast::Name target;
  std::string tensor_key;  // full key of the tied tensor
  size_t rank = 0;
  std::vector<ExprPtr> shape;
};

class CheckContext {
 public:
  explicit CheckContext(Diagnostics& diagnostics) : diag(diagnostics) {}

  Diagnostics& diag;
  Layout layout;
  std::vector<int> layer_axes;  // distinct axes of the top-level stacks, for stage()
  std::vector<PendingTie> ties;
  // (stack key, mesh) pairs whose missing axis is reported: once per stack
  // and mesh, not for every declaration inside the stack.
  std::set<std::pair<std::string, int>> reported_enclosing;

  // ---- config (check_config.cpp) ----
  // Declares the parameters, resolves their defaults, reports duplicates and
  // default cycles, and evaluates every default that reduces to a constant.
  void declare_params(const std::vector<const ast::Param*>& params);
  // Names -> parameter indices; null if a name is unknown (reported).
  ExprPtr resolve(const ast::Expr& expr);
  Condition resolve_condition(const std::optional<ast::Condition>& condition);
  // A list parameter (`int[]`) by name; reports an unknown or integer one.
  std::optional<int> resolve_list_param(const ast::Name& name);
  // Value from literals and constant defaults; reports inexact division,
  // division by zero and overflow at the failing operation.
  std::optional<int64_t> evaluate(const Expr& expr);
  // Like evaluate(), and a known value must be positive; `what` names the
  // extent in the message ("dim 0 of tensor 'x'").
  std::optional<int64_t> check_extent(const Expr& expr, const std::string& what);
  // Value from literals and constant defaults, reporting nothing.
  std::optional<int64_t> known_value(const Expr& expr) const;
  // "-2 ('a - b' with the config defaults)", or just "0" for a literal.
  std::string describe_value(const Expr& expr, int64_t value) const;
  void warn_unused_params();

  // ---- mesh and keys (checker_context.cpp) ----
  // One `mesh` line; axes named by an earlier mesh are shared with it.
  void declare_mesh(const ast::Mesh& mesh);
  // `on NAME` -> mesh index; reports an unknown name.
  std::optional<int> resolve_mesh(const ast::Name& name);
  bool on_mesh(int axis, int mesh) const;
  // Reports `axis` (used at `loc` by `what`) when mesh `mesh` lacks it.
  // `enclosing`: the axis is an enclosing stack's, so the fix is to give the
  // mesh that axis, not to move the declaration.
  bool check_axis_on_mesh(int axis, int mesh, Loc loc, const std::string& what, bool enclosing = false);
  std::string describe_mesh(int mesh) const;  // "mesh experts (etp, ep, edp, pp)"
  // Reports an unknown axis (or the missing mesh, once).
  std::optional<int> resolve_axis(const ast::Name& name);
  std::optional<int> find_axis(const std::string& name) const;  // silent
  // Records a full key; reports it when it clashes with an earlier
  // declaration whose conditions are not complementary.
  void claim_key(const std::string& full_key, KeyUse use);
  const std::vector<KeyUse>* key_uses(const std::string& full_key) const;
  // Whether the declaration at `loc` was reported as a duplicate key.
  bool duplicate_key_at(Loc loc) const { return duplicate_keys_.count({loc.line, loc.col}) > 0; }
  std::vector<std::string> tensor_keys() const;

 private:
  std::unordered_map<std::string, int> params_by_name_;
  std::vector<std::optional<int64_t>> param_values_;
  std::vector<bool> param_used_;
  std::unordered_map<std::string, int> axes_by_name_;
  bool mesh_declared_ = false;
  std::map<std::string, Loc> axis_constants_;
  bool reported_missing_mesh_ = false;
  std::unordered_map<std::string, std::vector<KeyUse>> keys_;
  std::set<std::pair<int, int>> duplicate_keys_;  // (line, col)
};

// ---- the passes over declarations ----

// check_tensor.cpp: one tensor declaration in its scope.
TensorDecl check_tensor(CheckContext& ctx, const ast::Tensor& tensor, const Scope& scope);

// check_block.cpp: the members of one generated class (the top level or a
// stack body), in declaration order.
class BlockChecker {
 public:
  BlockChecker(CheckContext& ctx, Scope scope) : ctx_(ctx), scope_(std::move(scope)) {}
  void add(const ast::Tensor& tensor);
  void add(const ast::Object& object);
  void add(const ast::Stack& stack);
  Block finish() { return std::move(block_); }

 private:
  std::vector<Condition> conditions_with(const Condition& own) const;
  // Reports the enclosing stacks' axes that mesh `mesh` lacks.
  void check_enclosing_axes(int mesh, Loc loc, const std::string& what);
  void check_stage_stack(StackDecl& decl, const ast::Stage& stage, const std::string& full_key);
  void check_virtual(StackDecl& decl, const ast::Stack& stack, const std::string& full_key);

  CheckContext& ctx_;
  Scope scope_;
  Block block_;
};

// check_block.cpp: every tied(KEY), once all tensors are declared.
void resolve_ties(CheckContext& ctx);

// check_commons.cpp: common values and transients; check_optimizers.cpp:
// optimizer blocks.
void check_commons_and_transients(CheckContext& ctx, const ast::Schema& schema);
void check_optimizers(CheckContext& ctx, const ast::Schema& schema);
// check_mapping.cpp: every `mapping` block, once the layout is complete.
void check_mappings(CheckContext& ctx, const ast::Schema& schema);

// Once the layout is complete, the C++ names it generates:
// check_class_names.cpp, those of the generated classes;
// check_member_names.cpp, the members each class gets.
void check_class_names(CheckContext& ctx);
void check_member_names(CheckContext& ctx);
// Every class name visible inside Model: the generated classes and those
// the generated code uses.
std::vector<std::string> class_names_in_model(const Layout& layout);

}  // namespace distckpt::gen
