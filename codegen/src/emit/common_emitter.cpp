// `common KEY: TYPE;` and `transient KEY;`: entries outside the tensor
// blocks, each a setter on Model. Common values are saved once; transient
// ones are never saved and handed back on load.
#include "emit/layout_part.h"

namespace distckpt::gen {
namespace {

class CommonPart : public LayoutPart {
 public:
  explicit CommonPart(const EmitContext& ctx) : layout_(ctx.layout()) {}

  void model_declarations(Printer& h) const override {
    for (const CommonDecl& c : layout_.commons) {
      h.emit(R"tmpl(
        // common $key$: $schema_type$ (saved once)
        Model& $acc$($type$ value);
      )tmpl",
             "key", c.key, "schema_type", schema_type(c.type), "acc", c.accessor, "type", common_type(c.type));
    }
    for (const TransientDecl& t : layout_.transients) {
      h.emit(R"tmpl(
        // transient $key$ (never saved, handed back on load)
        Model& $acc$(distckpt::Value value);
      )tmpl",
             "key", t.key, "acc", t.accessor);
    }
  }

  void model_definitions(Printer& s) const override {
    for (const CommonDecl& c : layout_.commons) {
      s.emit(R"tmpl(
        Model& Model::$acc$($type$ value) {
          builder_.set_common($key$, distckpt::Value(value));
          return *this;
        }

      )tmpl",
             "acc", c.accessor, "type", common_type(c.type), "key", quoted(c.key));
    }
    for (const TransientDecl& t : layout_.transients) {
      s.emit(R"tmpl(
        Model& Model::$acc$(distckpt::Value value) {
          builder_.set_transient($key$, std::move(value));
          return *this;
        }

      )tmpl",
             "acc", t.accessor, "key", quoted(t.key));
    }
  }

 private:
  static const char* schema_type(CommonDecl::Type type) {
    switch (type) {
      case CommonDecl::Type::kInt:
        return "int";
      case CommonDecl::Type::kFloat:
        return "float";
      case CommonDecl::Type::kString:
        return "string";
      case CommonDecl::Type::kBool:
        return "bool";
    }
    return "int";
  }

  const Layout& layout_;
};

}  // namespace

std::unique_ptr<LayoutPart> common_part(const EmitContext& ctx) { return std::make_unique<CommonPart>(ctx); }

}  // namespace distckpt::gen
