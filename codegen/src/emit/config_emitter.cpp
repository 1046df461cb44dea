// `config { ... }`: the Config struct the trainer fills, ResolvedConfig with
// every value known, and resolve(), which applies the defaults.
#include <functional>

#include "emit/layout_part.h"

namespace distckpt::gen {
namespace {

class ConfigPart : public LayoutPart {
 public:
  explicit ConfigPart(const EmitContext& ctx) : ctx_(ctx), layout_(ctx.layout()) {}

  void types(Printer& h) const override {
    const std::string fields = Printer::capture([&](Printer& p) {
      for (const ConfigParam& param : layout_.params) {
        if (param.list) {
          p.print("std::vector<int64_t> $name$;  // optional list\n", "name", param.name);
          continue;
        }
        p.print("std::optional<int64_t> $name$;  // $note$\n", "name", param.name, "note",
                param.default_value ? "default: " + ctx_.schema(*param.default_value) : "required");
      }
    });
    const std::string resolved = Printer::capture([&](Printer& p) {
      for (const ConfigParam& param : layout_.params) {
        p.print(param.list ? "std::vector<int64_t> $name$;\n" : "int64_t $name$ = 0;\n", "name", param.name);
      }
    });
    h.emit(R"tmpl(
      // Config parameters of layout $layout$; those without a default must be set.
      struct Config {
        $fields$
      };

      // Every parameter with its value: defaults applied, divisions checked.
      struct ResolvedConfig {
        $resolved$
      };

      ResolvedConfig resolve(const Config& config);

    )tmpl",
           "layout", layout_.name, "fields", fields, "resolved", resolved);
  }

  void functions(Printer& s) const override {
    s.emit(R"tmpl(
      ResolvedConfig resolve(const Config& config) {
        distckpt::layout::ConfigChecker check($layout$);
        ResolvedConfig c;
        $required$
        check.done();
        $defaults$
        return c;
      }

    )tmpl",
           "layout", quoted(layout_.name), "required", required(), "defaults", defaults());
  }

 private:
  // Parameters without a default: the trainer must set them.
  std::string required() const {
    return Printer::capture([&](Printer& p) {
      for (const ConfigParam& param : layout_.params) {
        if (param.list) {
          p.print("c.$name$ = config.$name$;\n", "name", param.name);
        } else if (!param.default_value) {
          p.print("c.$name$ = check.required(\"$name$\", config.$name$);\n", "name", param.name);
        }
      }
    });
  }

  // The others, each after the parameters its default refers to.
  std::string defaults() const {
    std::string out;
    Printer p(&out);
    std::vector<bool> done(layout_.params.size(), false);
    for (size_t i = 0; i < layout_.params.size(); ++i) done[i] = !layout_.params[i].default_value;
    std::function<void(size_t)> visit = [&](size_t i) {
      if (done[i]) return;
      done[i] = true;
      const ConfigParam& param = layout_.params[i];
      for_each_param(*param.default_value, [&](int ref) { visit(static_cast<size_t>(ref)); });
      p.print("c.$name$ = config.$name$ ? *config.$name$ : $default$;\n", "name", param.name, "default",
              ctx_.cpp(*param.default_value));
    };
    for (size_t i = 0; i < layout_.params.size(); ++i) visit(i);
    return out;
  }

  static void for_each_param(const Expr& e, const std::function<void(int)>& f) {
    if (e.op == Expr::Op::kParam) f(e.param);
    if (e.lhs) for_each_param(*e.lhs, f);
    if (e.rhs) for_each_param(*e.rhs, f);
  }

  const EmitContext& ctx_;
  const Layout& layout_;
};

}  // namespace

std::unique_ptr<LayoutPart> config_part(const EmitContext& ctx) { return std::make_unique<ConfigPart>(ctx); }

}  // namespace distckpt::gen
