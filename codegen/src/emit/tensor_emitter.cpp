// `tensor KEY [shape] ...`: a typed setter and holds_ check on the owning
// class, a slot field, and the Builder::add_tensor call that declares it.
#include <fmt/format.h>

#include "emit/member_emitter.h"

namespace distckpt::gen {
namespace {

class TensorEmitter : public MemberEmitter {
 public:
  TensorEmitter(const EmitContext& ctx, const TensorDecl& decl, std::vector<const TensorDecl*> twins)
      : ctx_(ctx), t_(decl), twins_(std::move(twins)) {}

  void declarations(Printer& h, const ClassScope& in) const override {
    if (!primary()) return;
    std::string declared;  // each twin's declaration, as the schema gave it
    for (const TensorDecl* twin : twins_) declared += "// " + declaration(*twin, in.key_prefix) + "\n";
    h.emit(R"tmpl(
      $declared$
      $cls$& $acc$(at::Tensor tensor);
      bool holds_$acc$() const { return $acc$_.has_value(); }
    )tmpl",
           "declared", declared, "cls", in.name, "acc", t_.accessor);
  }

  void fields(Printer& h, const ClassScope&) const override {
    if (primary()) h.print("std::optional<size_t> $acc$_;\n", "acc", t_.accessor);
  }

  void slots(Printer& s, const SlotScope& at) const override {
    const Guard guard(s, {ctx_.condition_test(t_.condition), stage_test()});
    const std::string position = t_.stage == Stage::kAll
                                     ? at.position
                                     : fmt::format("{}.placed_on({})", at.position, ctx_.axis_constant(t_.stage_axis));
    s.emit(R"tmpl(
      $owner$$acc$_ = builder_.add_tensor(
          TensorSpec($key$,
                     {$shape$})$attributes$,
          $position$, $name$);
    )tmpl",
           "owner", at.owner, "acc", t_.accessor, "key", quoted(at.key_prefix + t_.key), "shape", shape(), "attributes",
           attributes(at), "position", position, "name", name(at));
  }

  void definitions(Printer& s, const ClassScope& in) const override {
    if (!primary()) return;
    s.emit(R"tmpl(
      $cls$& $cls$::$acc$(at::Tensor tensor) {
        $builder$set_tensor($acc$_, $key$, std::move(tensor));
        return *this;
      }

    )tmpl",
           "cls", in.qualified, "acc", t_.accessor, "builder", in.builder, "key", quoted(in.key_prefix + t_.key));
  }

 private:
  bool primary() const { return twins_.front() == &t_; }

  // The parameter name: stage(last) tensors live in the last model chunk.
  std::string name(const SlotScope& at) const {
    const std::string& prefix =
        t_.stage == Stage::kLast && !at.last_name_prefix.empty() ? at.last_name_prefix : at.name_prefix;
    return prefix.empty() ? quoted(t_.key) : prefix + " + " + quoted(t_.key);
  }

  std::string shape() const {
    std::vector<std::string> dims;
    for (const ExprPtr& dim : t_.shape) dims.push_back(ctx_.cpp(*dim));
    return comma_list(dims);
  }

  // The TensorSpec's builder calls, one per line, 8 columns in from the
  // statement (4 past the TensorSpec).
  std::string attributes(const SlotScope& at) const {
    std::string out;
    for (const Split& split : t_.splits) {
      std::vector<std::string> axes;
      for (const int axis : split.axes) axes.push_back(ctx_.axis_constant(axis));
      out += fmt::format("\n        .with_split({}, {{{}}})", split.dim, comma_list(axes));
    }
    if (t_.pad_dim) out += fmt::format("\n        .with_pad({})", *t_.pad_dim);
    for (const FusedPart& part : t_.fused) {
      out += fmt::format("\n        .with_fused_part({}, {})", quoted(part.name), ctx_.cpp(*part.extent));
    }
    if (!t_.dtype.empty()) out += fmt::format("\n        .with_dtype({})", quoted(t_.dtype));
    if (t_.mesh != 0) out += fmt::format("\n        .on_mesh({})", ctx_.mesh_constant(t_.mesh));
    if (!t_.tied_key.empty()) {
      out += fmt::format("\n        .tied_to({})", quoted(t_.tied_key));
    } else if (!at.stored_prefix.empty()) {
      out += fmt::format("\n        .stored_as({} + {})", at.stored_prefix, quoted(t_.key));
    }
    return out;
  }

  // stage(first|last): only the first/last rank of the layer axis holds it.
  std::string stage_test() const {
    if (t_.stage == Stage::kAll) return "";
    const std::string axis = ctx_.axis(t_.stage_axis);
    return t_.stage == Stage::kFirst ? fmt::format("mesh.{}.rank == 0", axis)
                                     : fmt::format("mesh.{0}.rank == mesh.{0}.size - 1", axis);
  }

  // "tensor KEY [shape] split(...) ... when p", in schema syntax with the full key.
  std::string declaration(const TensorDecl& t, const std::string& key_prefix) const {
    std::vector<std::string> dims, splits, parts;
    for (const ExprPtr& dim : t.shape) dims.push_back(ctx_.schema(*dim));
    std::string out = fmt::format("tensor {}{} [{}]", key_prefix, t.key, comma_list(dims));
    for (const Split& split : t.splits) {
      std::vector<std::string> axes;
      for (const int axis : split.axes) axes.push_back(ctx_.axis(axis));
      splits.push_back(fmt::format("{} by {}", split.dim, fmt::join(axes, " * ")));
    }
    if (!splits.empty()) out += " split(" + comma_list(splits) + ")";
    if (t.pad_dim) out += fmt::format(" pad({})", *t.pad_dim);
    if (t.stage != Stage::kAll) out += t.stage == Stage::kFirst ? " stage(first)" : " stage(last)";
    for (const FusedPart& part : t.fused) parts.push_back(part.name + ": " + ctx_.schema(*part.extent));
    if (!parts.empty()) out += " fused(" + comma_list(parts) + ")";
    if (!t.tied_key.empty()) out += " tied(" + t.tied_key + ")";
    if (!t.dtype.empty()) out += " dtype(" + t.dtype + ")";
    if (t.mesh != 0) out += " on " + ctx_.layout().meshes[t.mesh].name;
    return out + ctx_.condition_text(t.condition);
  }

  const EmitContext& ctx_;
  const TensorDecl& t_;
  std::vector<const TensorDecl*> twins_;
};

}  // namespace

std::unique_ptr<MemberEmitter> tensor_emitter(const EmitContext& ctx, const TensorDecl& decl,
                                              std::vector<const TensorDecl*> twins) {
  return std::make_unique<TensorEmitter>(ctx, decl, std::move(twins));
}

}  // namespace distckpt::gen
