// The Model class: its skeleton in the header (fixed members around the
// members of the top-level block and of the layout parts) and its
// definitions in the source, the constructor declaring every slot first.
#pragma once

#include "emit/emit_context.h"
#include "emit/layout_part.h"
#include "emit/member_emitter.h"
#include "emit/printer.h"

namespace distckpt::gen {

void emit_model_class(Printer& h, const EmitContext& ctx, const Members& members, const Parts& parts);
void emit_model_definitions(Printer& s, const EmitContext& ctx, const Members& members, const Parts& parts);

}  // namespace distckpt::gen
