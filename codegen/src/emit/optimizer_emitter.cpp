// `optimizer NAME { ... }`: a class next to Model that saves and restores
// LibTorch's Adam/AdamW state laid out like the parameters (or ZeRO-1
// distributed over an axis), and the includes it needs.
#include <fmt/format.h>

#include "emit/layout_part.h"

namespace distckpt::gen {
namespace {

class OptimizerPart : public LayoutPart {
 public:
  explicit OptimizerPart(const EmitContext& ctx) : ctx_(ctx), optimizers_(ctx.layout().optimizers) {}

  void includes(Printer& h) const override {
    if (optimizers_.empty()) return;
    h.emit(R"tmpl(
      #include "distckpt/layout/optimizer.h"
      #include "distckpt/optim/torch_optim.h"
    )tmpl");
  }

  // The optimizer classes read the Model's builder.
  void model_friends(Printer& h) const override {
    for (const OptimizerDecl& o : optimizers_) h.print("friend class $cls$;\n", "cls", o.class_name);
  }

  void after_model(Printer& h) const override {
    for (const OptimizerDecl& o : optimizers_) {
      const bool zero = !o.distributions.empty();
      h.emit(R"tmpl(
        // optimizer $name$: $states$ shaped and sharded like each parameter$zero$.
        class $cls$ {
         public:
          // With `distributed` false, full state is written by the main replicas instead.
          explicit $cls$(const Model& model, bool distributed = $distributed$);

          // The state of `optimizer` (torch::optim::Adam or AdamW over the bound parameters).
          template <typename TorchOptimizer>
          distckpt::StateDict state_dict(const TorchOptimizer& optimizer) const {
            return distckpt::layout::sharded_optimizer_state(builder_, spec_, distckpt::optimizer_state_dict(optimizer),
                                                              distckpt::layout::parameters_in_order(optimizer));
          }
          // What to merge into the model's state dict for load() to restore `optimizer`, from any layout.
          template <typename TorchOptimizer>
          distckpt::StateDict load_request(const TorchOptimizer& optimizer) const {
            return distckpt::layout::optimizer_load_request(builder_, spec_, distckpt::optimizer_state_dict(optimizer),
                                                            distckpt::layout::parameters_in_order(optimizer));
          }
          // Puts the state from load()'s result into `optimizer`.
          template <typename TorchOptimizer>
          void load_state_dict(TorchOptimizer& optimizer, const distckpt::StateDict& loaded) const {
            distckpt::load_optimizer_state_dict(
                optimizer, distckpt::layout::torch_optimizer_state(builder_, spec_, loaded.at("optimizer"),
                                                                   distckpt::layout::parameters_in_order(optimizer),
                                                                   distckpt::optimizer_state_dict(optimizer)));
          }

         private:
          const distckpt::layout::Builder& builder_;
          distckpt::layout::OptimizerSpec spec_;
        };

      )tmpl",
             "name", o.name, "states", comma_list(o.states), "zero", zero ? "; " + distributed_text(o) : "", "cls",
             o.class_name, "distributed", zero ? "true" : "false");
    }
  }

  void after_model_definitions(Printer& s) const override {
    for (const OptimizerDecl& o : optimizers_) {
      bool uses_config = false;
      std::vector<std::string> distributions;
      for (const OptimizerDecl::Distribution& d : o.distributions) {
        std::vector<std::string> axes;
        for (const int axis : d.axes) axes.push_back(ctx_.axis_constant(axis));
        uses_config = uses_config || d.instances;
        distributions.push_back(fmt::format("{{/*mesh=*/{}, /*axes=*/{{{}}}, /*instances=*/{}}}",
                                            ctx_.several_meshes() ? ctx_.mesh_constant(d.mesh) : "0", comma_list(axes),
                                            d.instances ? ctx_.cpp(*d.instances) : "1"));
      }
      s.emit(R"tmpl(
        $cls$::$cls$(const Model& model, bool distributed)
            : builder_(model.builder_), spec_{$name$, {$states$}, {$scalars$}, {}} {
          $body$
        }

      )tmpl",
             "cls", o.class_name, "name", quoted(o.name), "states", comma_list(o.states, quoted), "scalars",
             comma_list(o.scalars, quoted), "body",
             distributions.empty()
                 ? "static_cast<void>(distributed);  // the schema distributes no state"
                 : fmt::format("{}if (distributed) {{\n  spec_.distributed = {{\n      {},\n  }};\n}}",
                               uses_config ? "const ResolvedConfig& c = model.config_;\n" : "",
                               fmt::join(distributions, ",\n      ")));
    }
  }

 private:
  // "distributed over dp * cp (ZeRO-1), over edp on experts": the schema's lines.
  std::string distributed_text(const OptimizerDecl& o) const {
    std::vector<std::string> lines;
    for (const OptimizerDecl::Distribution& d : o.distributions) {
      std::vector<std::string> axes;
      for (const int axis : d.axes) axes.push_back(ctx_.axis(axis));
      std::string line = "distributed over " + fmt::format("{}", fmt::join(axes, " * "));
      if (d.instances) line += " instances(" + ctx_.schema(*d.instances) + ")";
      if (ctx_.several_meshes()) line += " on " + ctx_.layout().meshes[d.mesh].name;
      lines.push_back(line);
    }
    return comma_list(lines) + " (ZeRO-1)";
  }

  const EmitContext& ctx_;
  const std::vector<OptimizerDecl>& optimizers_;
};

}  // namespace

std::unique_ptr<LayoutPart> optimizer_part(const EmitContext& ctx) { return std::make_unique<OptimizerPart>(ctx); }

}  // namespace distckpt::gen
