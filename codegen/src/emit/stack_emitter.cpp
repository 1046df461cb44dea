// `stack KEY[count] over AXIS { ... }`: an element class nested in Model
// holding the body's members, an accessor by local index on the owning
// class, and the loop of Model's constructor over the elements this rank
// holds, which declares the body's slots for each of them.
#include <fmt/format.h>

#include "emit/member_emitter.h"

namespace distckpt::gen {
namespace {

class StackEmitter : public MemberEmitter {
 public:
  StackEmitter(const EmitContext& ctx, const StackDecl& decl)
      : ctx_(ctx), st_(decl), body_(member_emitters(ctx, decl.body)) {}

  void element_classes(Printer& h, const ClassScope& in) const override {
    const ClassScope inner = element_scope(in);
    emit_element_classes(body_, h, inner);
    h.emit(R"tmpl(
      // One element of stack $key$.
      class $cls$ {
       public:
        $cls$(distckpt::layout::Builder& builder, int64_t global_index)
            : builder_(&builder), global_index_(global_index) {}
        // Index of this element among all elements of $key$.
        int64_t global_index() const { return global_index_; }

        $declarations$

       private:
        friend class Model;
        distckpt::layout::Builder* builder_;
        int64_t global_index_;
        $fields$
      };

    )tmpl",
           "key", full_key(in), "cls", inner.name, "declarations",
           Printer::capture([&](Printer& p) { emit_declarations(body_, p, inner); }), "fields",
           Printer::capture([&](Printer& p) { emit_fields(body_, p, inner); }));
  }

  void declarations(Printer& h, const ClassScope& in) const override {
    h.emit(R"tmpl(
      // $declared$: the elements this rank holds, by local index
      int64_t $acc$_local_count() const { return static_cast<int64_t>($acc$_.size()); }
      $cls$& $acc$(int64_t local_index);
    )tmpl",
           "declared", declaration(in), "acc", st_.accessor, "cls", st_.class_name);
  }

  void fields(Printer& h, const ClassScope& in) const override {
    h.print("std::vector<$cls$> $acc$_;\n", "cls", element_scope(in).name, "acc", st_.accessor);
  }

  void slots(Printer& s, const SlotScope& at) const override {
    const Guard guard(s, {ctx_.condition_test(st_.condition)});
    const std::string d = std::to_string(at.depth);
    const std::string key = at.key_prefix + st_.key;
    SlotScope inner{at.depth + 1, "e" + d + ".", "at" + d, "name" + d, key + ".", ""};
    // Keys of `as keys` elements, and of everything inside one, carry the element index.
    const std::string stored_prefix = at.stored_prefix.empty() ? "" : at.stored_prefix + " + ";
    std::string stored_key;
    if (st_.as_keys) {
      stored_key = fmt::format("const std::string key{} = {}{} + std::to_string(i{}) + \".\";", d, stored_prefix,
                               quoted(st_.key + "."), d);
    } else if (!at.stored_prefix.empty()) {
      stored_key = fmt::format("const std::string key{} = {}{};", d, stored_prefix, quoted(st_.key + "."));
    }
    if (!stored_key.empty()) inner.stored_prefix = "key" + d;
    s.emit(R"tmpl(
      {  // stack $comment_key$ over $axis$
        const Placement placement$d${$count$, /*first=*/$first$, /*last=*/$last$};
        const auto [begin$d$, end$d$] = placement$d$.range(mesh.$axis$.rank, mesh.$axis$.size, $key$);
        for (int64_t i$d$ = begin$d$; i$d$ < end$d$; ++i$d$) {
          $cls$& e$d$ = $owner$$acc$_.emplace_back(builder_, i$d$);
          const Position at$d$ = $position$.within(i$d$, $count$, $axis_constant$, $key$, /*stacked_axis=*/$stacked$);
          const std::string name$d$ = $name_prefix$$key_dot$ + std::to_string(i$d$ - begin$d$) + ".";
          $stored_key$
          $body$
        }
      }
    )tmpl",
           Printer::Vars{
               {"d", d},
               {"key", quoted(key)},
               {"comment_key", key},
               {"axis", ctx_.axis(st_.axis)},
               {"axis_constant", ctx_.axis_constant(st_.axis)},
               {"count", ctx_.cpp(*st_.count)},
               {"first", st_.first_count ? ctx_.cpp(*st_.first_count) : "-1"},
               {"last", st_.last_count ? ctx_.cpp(*st_.last_count) : "-1"},
               {"cls", st_.class_name},
               {"owner", at.owner},
               {"acc", st_.accessor},
               {"position", at.position},
               {"stacked", st_.as_keys ? "false" : "true"},
               {"name_prefix", at.name_prefix.empty() ? "" : at.name_prefix + " + "},
               {"key_dot", quoted(st_.key + ".")},
               {"stored_key", stored_key},
               {"body", Printer::capture([&](Printer& p) { emit_slots(body_, p, inner); })},
           });
  }

  void element_definitions(Printer& s, const ClassScope& in) const override {
    emit_definitions(body_, s, element_scope(in));
  }

  void definitions(Printer& s, const ClassScope& in) const override {
    s.emit(R"tmpl(
      $element$& $cls$::$acc$(int64_t local_index) {
        return $acc$_.at(static_cast<size_t>(local_index));
      }

    )tmpl",
           "element", element_scope(in).qualified, "cls", in.qualified, "acc", st_.accessor);
  }

 private:
  std::string full_key(const ClassScope& in) const { return in.key_prefix + st_.key; }

  // "stack KEY[count] over AXIS first(n) as keys when p", in schema syntax
  // with the full key.
  std::string declaration(const ClassScope& in) const {
    std::string out = fmt::format("stack {}[{}] over {}", full_key(in), ctx_.schema(*st_.count), ctx_.axis(st_.axis));
    if (st_.first_count) out += " first(" + ctx_.schema(*st_.first_count) + ")";
    if (st_.last_count) out += " last(" + ctx_.schema(*st_.last_count) + ")";
    if (st_.as_keys) out += " as keys";
    return out + ctx_.condition_text(st_.condition);
  }

  // The element class, in which the body's members live.
  ClassScope element_scope(const ClassScope& in) const {
    return ClassScope{st_.class_name, "Model::" + st_.class_name, full_key(in) + ".", "builder_->"};
  }

  const EmitContext& ctx_;
  const StackDecl& st_;
  Members body_;
};

}  // namespace

std::unique_ptr<MemberEmitter> stack_emitter(const EmitContext& ctx, const StackDecl& decl) {
  return std::make_unique<StackEmitter>(ctx, decl);
}

}  // namespace distckpt::gen
