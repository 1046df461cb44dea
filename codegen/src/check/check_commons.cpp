// Common values and transient entries: keys outside the tensor blocks.
#include "check/checker_context.h"
#include "ir/cpp_names.h"

namespace distckpt::gen {

void check_commons_and_transients(CheckContext& ctx, const ast::Schema& schema) {
  // Keys share the state dict with tensors and objects (claim_key); their
  // setters are members of Model (check_member_names).
  for (const ast::Item& item : schema.items) {
    if (const auto* common = std::get_if<ast::Common>(&item)) {
      CommonDecl decl{common->key.text, common->type, accessor_name(common->key.text), common->key.loc};
      ctx.claim_key(decl.key, KeyUse{decl.loc, {}, false, false, 0, {}});
      ctx.layout.commons.push_back(std::move(decl));
    } else if (const auto* transient = std::get_if<ast::Transient>(&item)) {
      TransientDecl decl{transient->key.text, accessor_name(transient->key.text), transient->key.loc};
      ctx.claim_key(decl.key, KeyUse{decl.loc, {}, false, false, 0, {}});
      ctx.layout.transients.push_back(std::move(decl));
    }
  }
}

}  // namespace distckpt::gen
