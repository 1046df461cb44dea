// `mesh tp, pp, dp;` (and named meshes over the same ranks): the Mesh struct
// with this rank's coordinate on every axis, and the axis and mesh constants
// the source passes to the Builder.
#include <fmt/format.h>

#include "emit/layout_part.h"

namespace distckpt::gen {
namespace {

class MeshPart : public LayoutPart {
 public:
  explicit MeshPart(const EmitContext& ctx) : ctx_(ctx) {}

  void types(Printer& h) const override {
    std::string meshes;
    if (ctx_.several_meshes()) {
      for (const MeshDecl& m : ctx_.layout().meshes) {
        std::vector<std::string> axes;
        for (const int axis : m.axes) axes.push_back(ctx_.axis(axis));
        meshes += fmt::format("\n// mesh {}: {}", m.name, fmt::join(axes, " x "));
      }
      meshes += "\n// Both meshes cover the same ranks: the products of their axis sizes must agree.";
    }
    h.emit(R"tmpl(
      // This rank's coordinate (rank, size) on each mesh axis.$meshes$
      struct Mesh {
        $coords$
      };

    )tmpl",
           "meshes", meshes, "coords", Printer::capture([&](Printer& p) {
             for (const std::string& axis : ctx_.layout().mesh_axes) {
               p.print("distckpt::layout::AxisCoord $axis$;\n", "axis", axis);
             }
           }));
  }

  void file_local(Printer& s) const override {
    std::vector<std::string> constants;
    for (size_t i = 0; i < ctx_.layout().mesh_axes.size(); ++i) {
      constants.push_back(fmt::format("{} = {}", ctx_.axis_constant(static_cast<int>(i)), i));
    }
    s.emit(R"tmpl(
      // Mesh axes, in schema order.
      enum Axis : int {$constants$};

    )tmpl",
           "constants", constants.empty() ? "" : " " + comma_list(constants) + " ");
    if (!ctx_.several_meshes()) return;
    std::vector<std::string> meshes;
    for (size_t i = 0; i < ctx_.layout().meshes.size(); ++i) {
      meshes.push_back(fmt::format("{} = {}", ctx_.mesh_constant(static_cast<int>(i)), i));
    }
    std::vector<std::string> axes_of;
    for (const MeshDecl& m : ctx_.layout().meshes) {
      std::vector<std::string> constants;
      for (const int axis : m.axes) constants.push_back(ctx_.axis_constant(axis));
      axes_of.push_back(fmt::format("{{{}, {{{}}}}}", quoted(m.name), comma_list(constants)));
    }
    s.emit(R"tmpl(
      // Meshes over the same ranks, in schema order.
      enum MeshIndex : int { $meshes$ };

      // This rank's coordinate on every axis, and each mesh's axes.
      distckpt::layout::MeshCoords mesh_coords(const Mesh& mesh) {
        return {{$names$},
                {$coords$},
                {$axes_of$}};
      }

    )tmpl",
           "meshes", comma_list(meshes), "names", ctx_.axis_names(), "coords", ctx_.axis_coords(), "axes_of",
           comma_list(axes_of));
  }

 private:
  const EmitContext& ctx_;
};

}  // namespace

std::unique_ptr<LayoutPart> mesh_part(const EmitContext& ctx) { return std::make_unique<MeshPart>(ctx); }

}  // namespace distckpt::gen
