// `optimizer NAME { ... }`: a class next to Model that saves and restores
// LibTorch's Adam/AdamW state laid out like the parameters (or ZeRO-1
// distributed over an axis), and the includes it needs.
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
      const bool zero = o.distributed_axis >= 0;
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
            return distckpt::layout::optimizer_load_request(
                builder_, distckpt::layout::optimizer_state_names(spec_, distckpt::optimizer_state_dict(optimizer)));
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
             "name", o.name, "states", comma_list(o.states), "zero",
             zero ? "; distributed over " + ctx_.axis(o.distributed_axis) + " (ZeRO-1)" : "", "cls", o.class_name,
             "distributed", zero ? "true" : "false");
    }
  }

  void after_model_definitions(Printer& s) const override {
    for (const OptimizerDecl& o : optimizers_) {
      s.emit(R"tmpl(
        $cls$::$cls$(const Model& model, bool distributed)
            : builder_(model.builder_),
              spec_{$name$, {$states$}, {$scalars$}, distributed ? $axis$ : -1} {}

      )tmpl",
             "cls", o.class_name, "name", quoted(o.name), "states", comma_list(o.states, quoted), "scalars",
             comma_list(o.scalars, quoted), "axis",
             o.distributed_axis >= 0 ? ctx_.axis_constant(o.distributed_axis) : "-1");
    }
  }

 private:
  const EmitContext& ctx_;
  const std::vector<OptimizerDecl>& optimizers_;
};

}  // namespace

std::unique_ptr<LayoutPart> optimizer_part(const EmitContext& ctx) { return std::make_unique<OptimizerPart>(ctx); }

}  // namespace distckpt::gen
