// The layout-level constructs (config, mesh, common values and transients,
// optimizers): each contributes to fixed sections of the two generated
// files, which emit_cpp.cpp lays out. A part overrides the sections it has
// something for; the members of Model's blocks go through member_emitter.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "emit/emit_context.h"
#include "emit/printer.h"

namespace distckpt::gen {

class LayoutPart {
 public:
  virtual ~LayoutPart() = default;

  // ---- the header ----
  virtual void includes(Printer& h) const {}            // #include lines
  virtual void types(Printer& h) const {}               // namespace scope, before Model
  virtual void model_declarations(Printer& h) const {}  // public members of Model
  virtual void model_friends(Printer& h) const {}       // friends of Model
  virtual void after_model(Printer& h) const {}         // namespace scope, after Model

  // ---- the source ----
  virtual void file_local(Printer& s) const {}         // the anonymous namespace
  virtual void functions(Printer& s) const {}          // namespace scope, before Model's definitions
  virtual void model_definitions(Printer& s) const {}  // Model's members
  virtual void after_model_definitions(Printer& s) const {}
};

using Parts = std::vector<std::unique_ptr<LayoutPart>>;

// What `section` of every part prints, in order, as one block.
inline std::string emit_section(const Parts& parts, void (LayoutPart::*section)(Printer&) const) {
  return Printer::capture([&](Printer& p) {
    for (const auto& part : parts) ((*part).*section)(p);
  });
}

std::unique_ptr<LayoutPart> config_part(const EmitContext& ctx);
std::unique_ptr<LayoutPart> mesh_part(const EmitContext& ctx);
std::unique_ptr<LayoutPart> common_part(const EmitContext& ctx);  // common values and transients
std::unique_ptr<LayoutPart> optimizer_part(const EmitContext& ctx);
std::unique_ptr<LayoutPart> mapping_part(const EmitContext& ctx);  // name mappings

}  // namespace distckpt::gen
