// member_emitters(): the block's declarations, each to its construct's emitter.
#include "emit/member_emitter.h"

namespace distckpt::gen {
namespace {

// Every declaration of `decls` with the accessor of decls[index], in order.
template <typename Decl>
std::vector<const Decl*> twins_of(const std::vector<Decl>& decls, size_t index) {
  std::vector<const Decl*> twins;
  for (const Decl& d : decls) {
    if (d.accessor == decls[index].accessor) twins.push_back(&d);
  }
  return twins;
}

}  // namespace

Members member_emitters(const EmitContext& ctx, const Block& block) {
  Members members;
  for (const Member& m : block.order) {
    switch (m.kind) {
      case Member::Kind::kTensor:
        members.push_back(tensor_emitter(ctx, block.tensors[m.index], twins_of(block.tensors, m.index)));
        break;
      case Member::Kind::kObject:
        members.push_back(object_emitter(ctx, block.objects[m.index], twins_of(block.objects, m.index)));
        break;
      case Member::Kind::kStack:
        members.push_back(stack_emitter(ctx, *block.stacks[m.index]));
        break;
    }
  }
  return members;
}

void emit_element_classes(const Members& members, Printer& h, const ClassScope& in) {
  for (const auto& m : members) m->element_classes(h, in);
}

void emit_declarations(const Members& members, Printer& h, const ClassScope& in) {
  for (const auto& m : members) m->declarations(h, in);
}

void emit_fields(const Members& members, Printer& h, const ClassScope& in) {
  for (const auto& m : members) m->fields(h, in);
}

void emit_slots(const Members& members, Printer& s, const SlotScope& at) {
  for (const auto& m : members) m->slots(s, at);
}

void emit_definitions(const Members& members, Printer& s, const ClassScope& in) {
  for (const auto& m : members) m->element_definitions(s, in);
  for (const auto& m : members) m->definitions(s, in);
}

}  // namespace distckpt::gen
