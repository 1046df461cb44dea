// The Model class (see model_emitter.h).
#include "emit/model_emitter.h"

#include <fmt/format.h>

#include "emit/emit_cpp.h"

namespace distckpt::gen {
namespace {

const ClassScope kModel{"Model", "Model", "", "builder_."};

// The schema's name mappings go into every checkpoint saved with these options.
std::string record_mappings(const Layout& layout) {
  std::vector<std::string> calls;
  for (const MappingDecl& m : layout.mappings) calls.push_back(m.function + "_of(config_)");
  if (calls.empty()) return "";
  return fmt::format("options.name_mappings = {{{}}};", comma_list(calls));
}

// Virtual pipeline stages: the rank holds several model chunks, each bound
// from its own module.
std::string chunk_declarations(const EmitContext& ctx) {
  const StackDecl* stack = ctx.layout().chunked_stack;
  if (stack == nullptr) return "";
  return Printer::capture([&](Printer& p) {
    p.emit(R"tmpl(
      // Model chunks (virtual pipeline stages) on this rank: chunk k is virtual stage k * $axis$ size + $axis$ rank.
      // stage(first) entries live in chunk 0 of the first stage, stage(last) ones in the last chunk of the last.
      int64_t chunk_count() const { return chunks_; }
      // bind() for one chunk's module: names relative to the chunk, stack indices local to it.
      Model& bind_chunk(int64_t chunk, const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                        const std::vector<std::pair<std::string, std::string>>& name_map = {});
      template <typename NamedTensors, typename = decltype(std::declval<const NamedTensors&>().pairs())>
      Model& bind_chunk(int64_t chunk, const NamedTensors& named_parameters,
                        const std::vector<std::pair<std::string, std::string>>& name_map = {}) {
        return bind_chunk(chunk, named_parameters.pairs(), name_map);
      }
    )tmpl",
           "axis", ctx.axis(stack->axis));
  });
}

// Several meshes: a function of the source builds them (mesh_emitter.cpp).
std::string mesh_coords(const EmitContext& ctx) {
  if (ctx.several_meshes()) return "mesh_coords(mesh)";
  return fmt::format("distckpt::layout::MeshCoords{{{{{}}}, {{{}}}}}", ctx.axis_names(), ctx.axis_coords());
}

}  // namespace

void emit_model_class(Printer& h, const EmitContext& ctx, const Members& members, const Parts& parts) {
  h.emit(R"tmpl(
    // The sharded state of layout $layout$ on this rank, filled by the trainer.
    class Model {
     public:
      $element_classes$
      Model(const Config& config, const Mesh& mesh);
      Model(const Model&) = delete;  // elements point into the builder
      Model& operator=(const Model&) = delete;

      const ResolvedConfig& config() const { return config_; }

      $declarations$

      // Fills tensors from module parameters (local stack indices in the names);
      // `name_map` renames module prefixes to schema prefixes first.
      Model& bind(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                  const std::vector<std::pair<std::string, std::string>>& name_map = {});
      // The same from what a LibTorch module returns: bind(module->named_parameters()).
      template <typename NamedTensors, typename = decltype(std::declval<const NamedTensors&>().pairs())>
      Model& bind(const NamedTensors& named_parameters,
                  const std::vector<std::pair<std::string, std::string>>& name_map = {}) {
        return bind(named_parameters.pairs(), name_map);
      }
      $chunk_declarations$
      // Throws listing every declared entry this rank has not set.
      distckpt::StateDict state_dict() const;
      // What to load without a model: the same entries without data.
      distckpt::StateDict metadata_state_dict(at::ScalarType default_dtype = at::kFloat) const;
      // Save options recording this layout (name, fingerprint, schema text).
      distckpt::SaveOptions save_options() const;

      static constexpr const char* kLayoutName = $layout_literal$;
      static const char* schema_text();
      static const char* fingerprint();

     private:
      $friends$
      ResolvedConfig config_;
      distckpt::layout::Builder builder_;
      $chunk_fields$
      $fields$
    };

  )tmpl",
         Printer::Vars{
             {"layout", ctx.layout().name},
             {"layout_literal", quoted(ctx.layout().name)},
             {"element_classes", Printer::capture([&](Printer& p) { emit_element_classes(members, p, kModel); })},
             {"declarations", Printer::capture([&](Printer& p) {
                emit_declarations(members, p, kModel);
                for (const auto& part : parts) part->model_declarations(p);
              })},
             {"friends", emit_section(parts, &LayoutPart::model_friends)},
             {"fields", Printer::capture([&](Printer& p) { emit_fields(members, p, kModel); })},
             {"chunk_declarations", chunk_declarations(ctx)},
             {"chunk_fields", ctx.layout().chunked_stack ? "int64_t chunks_ = 1;" : ""},
         });
}

void emit_model_definitions(Printer& s, const EmitContext& ctx, const Members& members, const Parts& parts) {
  SlotScope top;
  top.position = "Position{}";
  top.name_prefix = ctx.first_chunk_prefix();
  top.last_name_prefix = ctx.last_chunk_prefix();
  const StackDecl* chunked = ctx.layout().chunked_stack;
  s.emit(R"tmpl(
    Model::Model(const Config& config, const Mesh& mesh)
        : config_(resolve(config)),
          builder_($layout$, $mesh_coords$) {
      const ResolvedConfig& c = config_;
      $chunks$
      $slots$
    }

    $definitions$
    Model& Model::bind(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                       const std::vector<std::pair<std::string, std::string>>& name_map) {
      builder_.bind(named_parameters, name_map);
      return *this;
    }
    $bind_chunk$

    distckpt::StateDict Model::state_dict() const { return builder_.state_dict(); }

    distckpt::StateDict Model::metadata_state_dict(at::ScalarType default_dtype) const {
      return builder_.metadata_state_dict(default_dtype);
    }

    distckpt::SaveOptions Model::save_options() const {
      distckpt::SaveOptions options;
      options.layout_name = kLayoutName;
      options.layout_fingerprint = fingerprint();
      options.layout_schema = kSchema;
      $record_mappings$
      return options;
    }

    const char* Model::schema_text() { return kSchema; }

    const char* Model::fingerprint() { return "$fingerprint$"; }

  )tmpl",
         Printer::Vars{
             {"layout", quoted(ctx.layout().name)},
             {"mesh_coords", mesh_coords(ctx)},
             {"chunks", chunked ? "chunks_ = " + ctx.cpp(*chunked->chunks) + ";" : ""},
             {"bind_chunk", chunked ? R"(
Model& Model::bind_chunk(int64_t chunk,
                        const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                        const std::vector<std::pair<std::string, std::string>>& name_map) {
  builder_.bind_chunk(chunk, chunks_, named_parameters, name_map);
  return *this;
}
)"
                                    : ""},
             {"slots", Printer::capture([&](Printer& p) { emit_slots(members, p, top); })},
             {"definitions", Printer::capture([&](Printer& p) {
                emit_definitions(members, p, kModel);
                for (const auto& part : parts) part->model_definitions(p);
              })},
             {"fingerprint", layout_fingerprint(ctx.layout().source_text)},
             {"record_mappings", record_mappings(ctx.layout())},
         });
}

}  // namespace distckpt::gen
