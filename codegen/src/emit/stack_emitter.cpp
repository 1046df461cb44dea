// `stack KEY[count] over AXIS { ... }`: an element class nested in Model
// holding the body's members, an accessor by local index on the owning
// class, and the loop of Model's constructor over the elements this rank
// holds, which declares the body's slots for each of them. A stack with
// virtual(n) loops over the rank's model chunks too; one with stage(...)
// holds every element on that stage.
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
      // $declared$: the elements this rank holds, by local index$chunk_order$
      int64_t $acc$_local_count() const { return static_cast<int64_t>($acc$_.size()); }
      $cls$& $acc$(int64_t local_index);
    )tmpl",
           "declared", declaration(in), "acc", st_.accessor, "cls", st_.class_name, "chunk_order",
           chunked() ? " (chunk by chunk)" : "");
    if (!chunked()) return;
    h.emit(R"tmpl(
      // The elements of model chunk `chunk`: local indices [first, first + count), in global order.
      std::pair<int64_t, int64_t> $acc$_chunk(int64_t chunk) const { return $acc$_chunks_.at(static_cast<size_t>(chunk)); }
    )tmpl",
           "acc", st_.accessor);
  }

  void fields(Printer& h, const ClassScope& in) const override {
    h.print("std::vector<$cls$> $acc$_;\n", "cls", element_scope(in).name, "acc", st_.accessor);
    if (chunked())
      h.print("std::vector<std::pair<int64_t, int64_t>> $acc$_chunks_;  // (first, count)\n", "acc", st_.accessor);
  }

  void slots(Printer& s, const SlotScope& at) const override {
    const Guard guard(s, {ctx_.condition_test(st_.condition)});
    const std::string d = std::to_string(at.depth);
    const std::string key = at.key_prefix + st_.key;
    SlotScope inner{at.depth + 1, "e" + d + ".", "at" + d, "name" + d, key + ".", "", ""};
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
    const std::string name_prefix = st_.stage == Stage::kLast ? at.last_name_prefix : at.name_prefix;
    Printer::Vars vars{
        {"d", d},
        {"key", quoted(key)},
        {"comment_key", key},
        {"count", ctx_.cpp(*st_.count)},
        {"cls", st_.class_name},
        {"owner", at.owner},
        {"acc", st_.accessor},
        {"position", at.position},
        {"stacked", st_.as_keys ? "false" : "true"},
        {"name_prefix", name_prefix.empty() ? "" : name_prefix + " + "},
        {"key_dot", quoted(st_.key + ".")},
        {"stored_key", stored_key},
        {"body", Printer::capture([&](Printer& p) { emit_slots(body_, p, inner); })},
    };
    if (st_.stage != Stage::kAll) {
      stage_slots(s, vars);
      return;
    }
    vars["axis"] = ctx_.axis(st_.axis);
    vars["axis_constant"] = ctx_.axis_constant(st_.axis);
    vars["placement"] = placement();
    if (chunked()) {
      vars["chunks"] = ctx_.schema(*st_.chunks);
      // Each chunk's elements are named from 0 under the chunk's prefix, as its own module names them.
      s.emit(R"tmpl(
        {  // stack $comment_key$ over $axis$, $chunks$ virtual stages per stage
          const Placement placement$d$$placement$;
          const auto ranges$d$ = placement$d$.chunk_ranges(mesh.$axis$.rank, mesh.$axis$.size, $key$);
          for (int64_t chunk = 0; chunk < chunks_; ++chunk) {
            const auto [begin$d$, end$d$] = ranges$d$[static_cast<size_t>(chunk)];
            $acc$_chunks_.emplace_back(static_cast<int64_t>($owner$$acc$_.size()), end$d$ - begin$d$);
            for (int64_t i$d$ = begin$d$; i$d$ < end$d$; ++i$d$) {
              $cls$& e$d$ = $owner$$acc$_.emplace_back(builder_, i$d$);
              const Position at$d$ = $position$.within(i$d$, $count$, $axis_constant$, $key$, /*stacked_axis=*/$stacked$);
              const std::string name$d$ = distckpt::layout::chunk_prefix(chunk) + $key_dot$ + std::to_string(i$d$ - begin$d$) + ".";
              $stored_key$
              $body$
            }
          }
        }
      )tmpl",
             vars);
      return;
    }
    s.emit(R"tmpl(
      {  // stack $comment_key$ over $axis$
        const Placement placement$d$$placement$;
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
           vars);
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
  bool chunked() const { return ctx_.layout().chunked_stack == &st_; }

  // "{count, first, last}", plus the chunks and the explicit layout when given.
  std::string placement() const {
    std::string out = fmt::format("{{{}, /*first=*/{}, /*last=*/{}", ctx_.cpp(*st_.count),
                                  st_.first_count ? ctx_.cpp(*st_.first_count) : "-1",
                                  st_.last_count ? ctx_.cpp(*st_.last_count) : "-1");
    if (chunked() || st_.layout_param >= 0) {
      out += fmt::format(", /*chunks=*/{}", chunked() ? "chunks_" : "1");
      if (st_.layout_param >= 0) out += ", c." + ctx_.layout().params[st_.layout_param].name;
    }
    return out + "}";
  }

  // stage(first|last): the whole stack on the first/last stage of the layer axis.
  void stage_slots(Printer& s, Printer::Vars vars) const {
    const std::string axis = ctx_.axis(st_.stage_axis);
    vars["which"] = st_.stage == Stage::kFirst ? "first" : "last";
    vars["test"] = st_.stage == Stage::kFirst ? fmt::format("mesh.{}.rank == 0", axis)
                                              : fmt::format("mesh.{0}.rank == mesh.{0}.size - 1", axis);
    vars["axis_constant"] = ctx_.axis_constant(st_.stage_axis);
    s.emit(R"tmpl(
      if ($test$) {  // stack $comment_key$ on the $which$ stage
        for (int64_t i$d$ = 0; i$d$ < $count$; ++i$d$) {
          $cls$& e$d$ = $owner$$acc$_.emplace_back(builder_, i$d$);
          const Position at$d$ =
              $position$.placed_on($axis_constant$).within(i$d$, $count$, /*axis=*/-1, $key$, /*stacked_axis=*/$stacked$);
          const std::string name$d$ = $name_prefix$$key_dot$ + std::to_string(i$d$) + ".";
          $stored_key$
          $body$
        }
      }
    )tmpl",
           vars);
  }

  // "stack KEY[count] over AXIS first(n) as keys when p", in schema syntax
  // with the full key.
  std::string declaration(const ClassScope& in) const {
    std::string out = fmt::format("stack {}[{}]", full_key(in), ctx_.schema(*st_.count));
    if (st_.stage != Stage::kAll) out += st_.stage == Stage::kFirst ? " stage(first)" : " stage(last)";
    if (st_.axis >= 0) out += " over " + ctx_.axis(st_.axis);
    if (st_.chunks) out += " virtual(" + ctx_.schema(*st_.chunks) + ")";
    if (st_.layout_param >= 0) out += " layout(" + ctx_.layout().params[st_.layout_param].name + ")";
    if (st_.first_count) out += " first(" + ctx_.schema(*st_.first_count) + ")";
    if (st_.last_count) out += " last(" + ctx_.schema(*st_.last_count) + ")";
    if (st_.as_keys) out += " as keys";
    if (st_.mesh != 0) out += " on " + ctx_.layout().meshes[st_.mesh].name;
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
