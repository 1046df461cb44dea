// One tensor declaration: shape, splits, pad, stage, fused parts, tied key,
// dtype and condition, each checked against the tensor's rank and scope.
#include <fmt/format.h>

#include <array>
#include <string_view>
#include <unordered_map>

#include "check/checker_context.h"
#include "check/names.h"
#include "ir/cpp_names.h"

namespace distckpt::gen {
namespace {

constexpr std::array<std::string_view, 10> kDtypes = {"float64", "float32", "float16", "bfloat16", "int64",
                                                      "int32",   "int16",   "int8",    "uint8",    "bool"};

// Everything the attribute checks need to know about the tensor.
struct TensorContext {
  CheckContext& ctx;
  const ast::Tensor& ast;
  const Scope& scope;
  std::string full_key;
  size_t rank = 0;
  std::vector<std::optional<int64_t>> extents;  // known dim extents
};

std::string dim_range(size_t rank) {
  return rank == 0 ? std::string("it has no dims") : fmt::format("dims 0..{}", rank - 1);
}

// Attributes that may appear once: report every repetition. `written` is
// the attribute as the schema spells it ("pad(...)", "on MESH").
template <typename Attr, typename LocOf>
void reject_repeats(TensorContext& t, const std::vector<Attr>& attrs, const char* written, LocOf loc_of) {
  for (size_t i = 1; i < attrs.size(); ++i) {
    t.ctx.diag
        .error(loc_of(attrs[i]), fmt::format("tensor '{}' has more than one {}; give it once", t.full_key, written))
        .note(loc_of(attrs[0]), "first given here");
  }
}

void check_splits(TensorContext& t, TensorDecl& decl) {
  std::vector<const ast::Split*> split_of_dim(t.rank, nullptr);
  std::unordered_map<int, const ast::Name*> splitting;  // axis -> where it splits this tensor
  for (const ast::Split& split : t.ast.splits) {
    const int64_t dim = split.dim.value;
    bool dim_ok = true;
    if (static_cast<uint64_t>(dim) >= t.rank) {
      t.ctx.diag.error(split.dim.loc, fmt::format("split dim {} is out of range for tensor '{}' of rank {} ({})", dim,
                                                  t.full_key, t.rank, dim_range(t.rank)));
      dim_ok = false;
    } else if (const ast::Split* earlier = split_of_dim[dim]) {
      std::vector<std::string> axes;
      for (const ast::Name& a : earlier->axes) axes.push_back(a.text);
      for (const ast::Name& a : split.axes) axes.push_back(a.text);
      t.ctx.diag
          .error(split.dim.loc, fmt::format("dim {} of tensor '{}' is split twice; split it over several axes at "
                                            "once, as in 'split({} by {})'",
                                            dim, t.full_key, dim, fmt::join(axes, " * ")))
          .note(earlier->dim.loc, "first split here");
      dim_ok = false;
    } else {
      split_of_dim[dim] = &split;
    }
    Split resolved{static_cast<int>(dim), {}};
    for (const ast::Name& name : split.axes) {
      const std::optional<int> axis = t.ctx.resolve_axis(name);
      if (!axis) continue;
      if (const EnclosingStack* stack = t.scope.stack_over(*axis)) {
        t.ctx.diag.error(name.loc, fmt::format("mesh axis '{}' already places the enclosing stack '{}'; tensor '{}' "
                                               "cannot also be split over it",
                                               name.text, stack->key, t.full_key));
        continue;
      }
      if (!t.ctx.check_axis_on_mesh(*axis, decl.mesh, name.loc, "tensor '" + t.full_key + "'")) continue;
      const auto [it, fresh] = splitting.emplace(*axis, &name);
      if (!fresh) {
        t.ctx.diag
            .error(name.loc, fmt::format("mesh axis '{}' splits tensor '{}' twice; an axis may split at most one dim",
                                         name.text, t.full_key))
            .note(it->second->loc, "first given here");
        continue;
      }
      resolved.axes.push_back(*axis);
    }
    if (dim_ok) decl.splits.push_back(std::move(resolved));
  }
}

void check_pad(TensorContext& t, TensorDecl& decl) {
  if (t.ast.pads.empty()) return;
  reject_repeats(t, t.ast.pads, "pad(...)", [](const ast::Int& pad) { return pad.loc; });
  const ast::Int& pad = t.ast.pads.front();
  if (static_cast<uint64_t>(pad.value) >= t.rank) {
    t.ctx.diag.error(pad.loc, fmt::format("pad({}) is out of range for tensor '{}' of rank {} ({})", pad.value,
                                          t.full_key, t.rank, dim_range(t.rank)));
    return;
  }
  decl.pad_dim = static_cast<int>(pad.value);
}

// stage() names the one axis that stacks layers: that of the top-level stacks.
void check_stage(TensorContext& t, TensorDecl& decl) {
  if (t.ast.stages.empty()) return;
  reject_repeats(t, t.ast.stages, "stage(...)", [](const ast::Stage& stage) { return stage.loc; });
  const ast::Stage& stage = t.ast.stages.front();
  const char* which = stage.last ? "last" : "first";
  decl.stage = stage.last ? Stage::kLast : Stage::kFirst;
  if (!t.scope.top_level()) {
    t.ctx.diag.error(stage.loc, fmt::format("stage({}) applies only to top-level tensors; tensor '{}' is inside stack "
                                            "'{}', which already places it",
                                            which, t.full_key, t.scope.stacks.back().key));
    return;
  }
  if (t.ctx.layer_axes.empty()) {
    t.ctx.diag.error(stage.loc, fmt::format("stage({}) needs a stack of layers spread over a mesh axis, but the "
                                            "layout has no top-level stack",
                                            which));
    return;
  }
  if (t.ctx.layer_axes.size() > 1) {
    std::vector<std::string> axes;
    for (const int axis : t.ctx.layer_axes) axes.push_back(t.ctx.layout.mesh_axes[axis]);
    t.ctx.diag.error(stage.loc, fmt::format("stage({}) is ambiguous: the top-level stacks are spread over different "
                                            "mesh axes ({}); stack the layers over one axis",
                                            which, join_names(axes)));
    return;
  }
  decl.stage_axis = t.ctx.layer_axes.front();
  t.ctx.check_axis_on_mesh(decl.stage_axis, decl.mesh, stage.loc, "tensor '" + t.full_key + "'");
  for (const Split& split : decl.splits) {
    for (const int axis : split.axes) {
      if (axis == decl.stage_axis) {
        t.ctx.diag.error(stage.loc,
                         fmt::format("stage({}) places tensor '{}' on one stage of '{}', so it cannot also "
                                     "be split over '{}'",
                                     which, t.full_key, t.ctx.layout.mesh_axes[axis], t.ctx.layout.mesh_axes[axis]));
      }
    }
  }
}

void check_fused(TensorContext& t, TensorDecl& decl) {
  if (t.ast.fused.empty()) return;
  reject_repeats(t, t.ast.fused, "fused(...)", [](const ast::Fused& fused) { return fused.loc; });
  const ast::Fused& fused = t.ast.fused.front();
  if (t.ast.splits.empty()) {
    t.ctx.diag.error(fused.loc, fmt::format("fused(...) on tensor '{}' needs a split: its parts are concatenated "
                                            "along the split dim",
                                            t.full_key));
  }
  if (fused.parts.size() < 2) {
    t.ctx.diag.error(fused.loc, fmt::format("fused(...) on tensor '{}' needs at least two parts", t.full_key));
  }
  std::unordered_map<std::string, Loc> names;
  bool all_known = true;
  bool overflow = false;  // parts summing past int64 certainly miss the dim
  int64_t sum = 0;
  for (const ast::FusedPart& part : fused.parts) {
    const auto [it, fresh] = names.emplace(part.name.text, part.name.loc);
    if (!fresh) {
      t.ctx.diag
          .error(part.name.loc, fmt::format("duplicate fused part '{}' in tensor '{}'", part.name.text, t.full_key))
          .note(it->second, "first declared here");
    }
    ExprPtr extent = t.ctx.resolve(*part.extent);
    std::optional<int64_t> value;
    if (extent) {
      value = t.ctx.check_extent(
          *extent, fmt::format("the extent of fused part '{}' of tensor '{}'", part.name.text, t.full_key));
    }
    all_known = all_known && value;
    if (all_known && !overflow) overflow = __builtin_add_overflow(sum, *value, &sum);
    decl.fused.push_back(FusedPart{part.name.text, std::move(extent)});
  }
  // The parts are laid out along the first split's dim; check when all is known.
  if (t.ast.splits.empty() || fused.parts.size() < 2 || !all_known) return;
  const int64_t dim = t.ast.splits.front().dim.value;
  if (static_cast<uint64_t>(dim) >= t.rank || !t.extents[dim]) return;
  if (overflow || sum != *t.extents[dim]) {
    const std::string total = overflow ? std::string("more than 2^63 - 1") : std::to_string(sum);
    t.ctx.diag.error(fused.loc, fmt::format("fused parts add up to {} but dim {} is {}; the parts of tensor '{}' "
                                            "must cover its split dim exactly",
                                            total, dim, *t.extents[dim], t.full_key));
  }
}

void check_dtype(TensorContext& t, TensorDecl& decl) {
  if (t.ast.dtypes.empty()) return;
  reject_repeats(t, t.ast.dtypes, "dtype(...)", [](const ast::Name& name) { return name.loc; });
  const ast::Name& dtype = t.ast.dtypes.front();
  for (const std::string_view known : kDtypes) {
    if (dtype.text == known) {
      decl.dtype = dtype.text;
      return;
    }
  }
  const std::vector<std::string> names(kDtypes.begin(), kDtypes.end());
  t.ctx.diag.error(dtype.loc, fmt::format("unknown dtype '{}'{}; dtypes are {}", dtype.text,
                                          did_you_mean(dtype.text, names), join_names(names)));
}

}  // namespace

TensorDecl check_tensor(CheckContext& ctx, const ast::Tensor& tensor, const Scope& scope) {
  TensorDecl decl;
  decl.key = tensor.key.text;
  decl.accessor = accessor_name(decl.key);
  decl.loc = tensor.key.loc;
  TensorContext t{ctx, tensor, scope, scope.key_prefix + decl.key, tensor.shape.size(), {}};
  decl.mesh = scope.mesh;
  if (!tensor.meshes.empty()) {
    reject_repeats(t, tensor.meshes, "on MESH", [](const ast::Name& name) { return name.loc; });
    if (const std::optional<int> mesh = ctx.resolve_mesh(tensor.meshes.front())) decl.mesh = *mesh;
  }
  for (size_t i = 0; i < tensor.shape.size(); ++i) {
    ExprPtr extent = ctx.resolve(*tensor.shape[i]);
    t.extents.push_back(extent ? ctx.check_extent(*extent, fmt::format("dim {} of tensor '{}'", i, t.full_key))
                               : std::nullopt);
    decl.shape.push_back(std::move(extent));
  }
  check_splits(t, decl);
  check_pad(t, decl);
  check_stage(t, decl);
  check_fused(t, decl);
  if (!tensor.tied.empty()) {
    reject_repeats(t, tensor.tied, "tied(...)", [](const ast::Name& name) { return name.loc; });
    decl.tied_key = tensor.tied.front().text;
    ctx.ties.push_back(PendingTie{tensor.tied.front(), t.full_key, t.rank, decl.shape});
  }
  check_dtype(t, decl);
  decl.condition = ctx.resolve_condition(tensor.condition);
  return decl;
}

}  // namespace distckpt::gen
