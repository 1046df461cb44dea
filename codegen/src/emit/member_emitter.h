// The members of a generated class (Model, or the element class of a
// stack): one emitter per tensor, object or stack declaration. The class
// skeleton asks each member for its piece of every section, in declaration
// order; a construct's whole C++ lives in its own emitter file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "emit/emit_context.h"
#include "emit/printer.h"
#include "ir/ir.h"

namespace distckpt::gen {

// The generated class a block's members belong to.
struct ClassScope {
  std::string name;        // "Model", "DecoderLayers"
  std::string qualified;   // for out-of-class definitions: "Model", "Model::DecoderLayers"
  std::string key_prefix;  // schema key prefix: "", "decoder.layers."
  std::string builder;     // how member functions reach the Builder: "builder_.", "builder_->"
};

// Where the Model constructor declares a block's slots.
struct SlotScope {
  int depth = 0;                 // stacks around the block
  std::string owner;             // where slot fields live: "" (the Model), "e0.", ...
  std::string position;          // C++ expression of the distckpt::layout::Position
  std::string name_prefix;       // C++ expression of the parameter-name prefix; "" at the top
  std::string key_prefix;        // schema key prefix ("decoder.layers.")
  std::string stored_prefix;     // C++ expression of the stored-key prefix; "" unless inside `as keys`
  std::string last_name_prefix;  // the name prefix of stage(last) members (the last model chunk's at the top)
};

class MemberEmitter {
 public:
  virtual ~MemberEmitter() = default;

  // Header, inside Model: element classes, innermost first (stacks only).
  virtual void element_classes(Printer& h, const ClassScope& in) const {}
  // Header: public members of the owning class.
  virtual void declarations(Printer& h, const ClassScope& in) const = 0;
  // Header: private members of the owning class.
  virtual void fields(Printer& h, const ClassScope& in) const = 0;
  // Source: the statements of Model's constructor that declare the slots.
  virtual void slots(Printer& s, const SlotScope& at) const = 0;
  // Source: element classes' member definitions, before the owner's (stacks only).
  virtual void element_definitions(Printer& s, const ClassScope& in) const {}
  // Source: out-of-class definitions of the public members.
  virtual void definitions(Printer& s, const ClassScope& in) const = 0;
};

using Members = std::vector<std::unique_ptr<MemberEmitter>>;

// One emitter per declaration of `block`, in declaration order: the one
// place that tells tensors, objects and stacks apart.
Members member_emitters(const EmitContext& ctx, const Block& block);

// Complementary twins (`when p` / `unless p`) share one setter and slot
// field: `twins` lists every declaration with the same accessor, in order,
// and only the first of them declares and defines the setter.
std::unique_ptr<MemberEmitter> tensor_emitter(const EmitContext& ctx, const TensorDecl& decl,
                                              std::vector<const TensorDecl*> twins);
std::unique_ptr<MemberEmitter> object_emitter(const EmitContext& ctx, const ObjectDecl& decl,
                                              std::vector<const ObjectDecl*> twins);
std::unique_ptr<MemberEmitter> stack_emitter(const EmitContext& ctx, const StackDecl& decl);

// Helpers for each pass over members.
void emit_element_classes(const Members& members, Printer& h, const ClassScope& in);
void emit_declarations(const Members& members, Printer& h, const ClassScope& in);
void emit_fields(const Members& members, Printer& h, const ClassScope& in);
void emit_slots(const Members& members, Printer& s, const SlotScope& at);
void emit_definitions(const Members& members, Printer& s, const ClassScope& in);

}  // namespace distckpt::gen
