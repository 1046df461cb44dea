// `mesh tp, pp, dp;`: the Mesh struct with this rank's coordinates, and the
// axis constants the source passes to the Builder.
#include <fmt/format.h>

#include "emit/layout_part.h"

namespace distckpt::gen {
namespace {

class MeshPart : public LayoutPart {
 public:
  explicit MeshPart(const EmitContext& ctx) : ctx_(ctx) {}

  void types(Printer& h) const override {
    h.emit(R"tmpl(
      // This rank's coordinate (rank, size) on each mesh axis.
      struct Mesh {
        $coords$
      };

    )tmpl",
           "coords", Printer::capture([&](Printer& p) {
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
  }

 private:
  const EmitContext& ctx_;
};

}  // namespace

std::unique_ptr<LayoutPart> mesh_part(const EmitContext& ctx) { return std::make_unique<MeshPart>(ctx); }

}  // namespace distckpt::gen
