// `mapping NAME { ... }`: a function building the distckpt::NameMapping of
// one config, next to Model; Model::save_options() records every mapping so
// that `distckpt convert --map NAME` finds it in the checkpoint.
#include <fmt/format.h>

#include "emit/layout_part.h"

namespace distckpt::gen {
namespace {

class MappingPart : public LayoutPart {
 public:
  explicit MappingPart(const EmitContext& ctx) : ctx_(ctx), mappings_(ctx.layout().mappings) {}

  void includes(Printer& h) const override {
    if (!mappings_.empty()) h.print("#include \"distckpt/format/name_mapping.h\"\n");
  }

  void after_model(Printer& h) const override {
    for (const MappingDecl& m : mappings_) {
      h.emit(R"tmpl(
        // mapping $name$: which external tensor holds which part of which checkpoint
        // tensor under `config` (load with LoadOptions::mapping, export with
        // `distckpt convert --to safetensors --map $name$`).
        distckpt::NameMapping $function$(const Config& config);

      )tmpl",
             "name", m.name, "function", m.function);
    }
  }

  void file_local(Printer& s) const override {
    for (const MappingDecl& m : mappings_) {
      s.emit(R"tmpl(
        distckpt::NameMapping $function$_of(const ResolvedConfig& c) {
          distckpt::NameMapping m($name$);
      )tmpl",
             "function", m.function, "name", quoted(m.name));
      s.indent();
      for (const MappedTensor& t : m.tensors) emit_entry(s, t);
      s.outdent();
      s.emit(R"tmpl(
          return m;
        }

      )tmpl");
    }
  }

  void functions(Printer& s) const override {
    for (const MappingDecl& m : mappings_) {
      s.emit(R"tmpl(
        distckpt::NameMapping $function$(const Config& config) { return $function$_of(resolve(config)); }

      )tmpl",
             "function", m.function);
    }
  }

 private:
  void emit_entry(Printer& s, const MappedTensor& t) const {
    std::vector<std::string> tests;
    for (const Condition& c : t.conditions) tests.push_back(ctx_.condition_test(c));
    Guard guard(s, tests);
    std::vector<std::string> shape;
    for (const ExprPtr& e : t.shape) shape.push_back(ctx_.cpp(*e));
    std::string calls;
    for (const MapIndex& index : t.indices) {
      calls += fmt::format("\n    .{}({}, {})", index.leading_axis ? "over" : "over_keys", quoted(index.name),
                           ctx_.cpp(*index.count));
    }
    if (t.part_dim >= 0) {
      calls += fmt::format("\n    .part({}, {}, {})", t.part_dim, ctx_.cpp(*t.part_offset), ctx_.cpp(*t.part_extent));
    }
    if (t.pad_dim) calls += fmt::format("\n    .with_pad({})", *t.pad_dim);
    s.emit(R"tmpl(
      // $source$
      m.map($key$, $external$, {$shape$})$calls$;
    )tmpl",
           "source", t.source, "key", quoted(t.key), "external", quoted(t.external), "shape", comma_list(shape),
           "calls", calls);
  }

  const EmitContext& ctx_;
  const std::vector<MappingDecl>& mappings_;
};

}  // namespace

std::unique_ptr<LayoutPart> mapping_part(const EmitContext& ctx) { return std::make_unique<MappingPart>(ctx); }

}  // namespace distckpt::gen
