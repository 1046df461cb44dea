// `object KEY per(...)`: an opaque blob per coordinate of the named axes. A
// setter taking the bytes, a slot field, and the Builder::add_object call.
#include <fmt/format.h>

#include "emit/member_emitter.h"

namespace distckpt::gen {
namespace {

class ObjectEmitter : public MemberEmitter {
 public:
  ObjectEmitter(const EmitContext& ctx, const ObjectDecl& decl, std::vector<const ObjectDecl*> twins)
      : ctx_(ctx), o_(decl), twins_(std::move(twins)) {}

  void declarations(Printer& h, const ClassScope& in) const override {
    if (!primary()) return;
    std::string declared;  // each twin's declaration, as the schema gave it
    for (const ObjectDecl* twin : twins_) declared += "// " + declaration(*twin, in.key_prefix) + "\n";
    h.emit(R"tmpl(
      $declared$
      $cls$& $acc$(std::string bytes);
    )tmpl",
           "declared", declared, "cls", in.name, "acc", o_.accessor);
  }

  void fields(Printer& h, const ClassScope&) const override {
    if (primary()) h.print("std::optional<size_t> $acc$_;\n", "acc", o_.accessor);
  }

  void slots(Printer& s, const SlotScope& at) const override {
    const Guard guard(s, {ctx_.condition_test(o_.condition)});
    std::vector<std::string> axes;
    for (const int axis : o_.per_axes) axes.push_back(ctx_.axis_constant(axis));
    s.emit(R"tmpl(
      $owner$$acc$_ = builder_.add_object($key$, {$axes$}, $position$, $name$$mesh$);
    )tmpl",
           "owner", at.owner, "acc", o_.accessor, "key",
           at.stored_prefix.empty() ? quoted(at.key_prefix + o_.key) : at.stored_prefix + " + " + quoted(o_.key),
           "axes", comma_list(axes), "position", at.position, "name",
           at.name_prefix.empty() ? quoted(o_.key) : at.name_prefix + " + " + quoted(o_.key), "mesh",
           o_.mesh != 0 ? ", " + ctx_.mesh_constant(o_.mesh) : "");
  }

  void definitions(Printer& s, const ClassScope& in) const override {
    if (!primary()) return;
    s.emit(R"tmpl(
      $cls$& $cls$::$acc$(std::string bytes) {
        $builder$set_object($acc$_, $key$, std::move(bytes));
        return *this;
      }

    )tmpl",
           "cls", in.qualified, "acc", o_.accessor, "builder", in.builder, "key", quoted(in.key_prefix + o_.key));
  }

 private:
  bool primary() const { return twins_.front() == &o_; }

  // "object KEY per(tp) when p", in schema syntax with the full key.
  std::string declaration(const ObjectDecl& o, const std::string& key_prefix) const {
    std::vector<std::string> axes;
    for (const int axis : o.per_axes) axes.push_back(ctx_.axis(axis));
    std::string out = "object " + key_prefix + o.key;
    if (!axes.empty()) out += " per(" + comma_list(axes) + ")";
    return out + ctx_.condition_text(o.condition);
  }

  const EmitContext& ctx_;
  const ObjectDecl& o_;
  std::vector<const ObjectDecl*> twins_;
};

}  // namespace

std::unique_ptr<MemberEmitter> object_emitter(const EmitContext& ctx, const ObjectDecl& decl,
                                              std::vector<const ObjectDecl*> twins) {
  return std::make_unique<ObjectEmitter>(ctx, decl, std::move(twins));
}

}  // namespace distckpt::gen
