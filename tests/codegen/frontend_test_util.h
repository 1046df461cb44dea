// Shared by the front-end tests: the complete example of docs/SCHEMA.md and
// helpers that compile a schema and list its diagnostics as "line:col: text".
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "diagnostics.h"
#include "frontend.h"
#include "ir/expr.h"
#include "ir/ir.h"

namespace distckpt::gen::testing {

// The example of docs/SCHEMA.md, verbatim.
inline const char* const kGptSchema = R"(layout gpt;

config {
  hidden: int;
  ffn: int;
  vocab: int;                        # padded vocabulary rows (may change between runs)
  layers: int;
  heads: int;
  kv_groups: int = heads;            # defaults may refer to other parameters
  head_dim: int = hidden / heads;
  tie_embeddings: int = 0;
}

mesh tp, pp, dp;                     # replicated over every axis a tensor is not split on

tensor embedding.word_embeddings.weight [vocab, hidden] split(0 by tp) pad(0) stage(first);

stack decoder.layers[layers] over pp {
  tensor self_attention.linear_qkv.weight [(heads + 2 * kv_groups) * head_dim, hidden]
      split(0 by tp) fused(q: heads * head_dim, k: kv_groups * head_dim, v: kv_groups * head_dim);
  tensor self_attention.linear_proj.weight [hidden, heads * head_dim] split(1 by tp);
  tensor input_layernorm.weight [hidden];
  tensor mlp.linear_fc1.weight [2 * ffn, hidden] split(0 by tp) fused(w: ffn, v: ffn);
  tensor mlp.linear_fc2.weight [hidden, ffn] split(1 by tp);
  object self_attention.core_attention._extra_state per(tp);
}

tensor decoder.final_layernorm.weight [hidden] stage(last);
tensor output_layer.weight [vocab, hidden] split(0 by tp) pad(0) stage(last) unless tie_embeddings;
tensor output_layer.weight [vocab, hidden] split(0 by tp) pad(0) stage(last)
    tied(embedding.word_embeddings.weight) when tie_embeddings;

optimizer adam {
  state exp_avg, exp_avg_sq like param;
  scalar step;
  distributed over dp;
}

common iteration: int;
common consumed_samples: int;
transient rng_tracker;
)";

struct Compiled {
  Diagnostics diagnostics;
  std::optional<Layout> layout;
};

inline Compiled compile(const std::string& source) {
  Compiled out{Diagnostics("test.shard", source), std::nullopt};
  out.layout = compile_schema("test.shard", source, out.diagnostics);
  return out;
}

// Each diagnostic of the given severity as "line:col: message", in the order found.
inline std::vector<std::string> diagnostics_of(const Compiled& compiled,
                                               Diagnostic::Severity severity = Diagnostic::Severity::kError) {
  std::vector<std::string> out;
  for (const Diagnostic& d : compiled.diagnostics.all()) {
    if (d.severity == severity) out.push_back(fmt::format("{}:{}: {}", d.loc.line, d.loc.col, d.message));
  }
  return out;
}

inline std::vector<std::string> errors_of(const std::string& source) { return diagnostics_of(compile(source)); }

}  // namespace distckpt::gen::testing
