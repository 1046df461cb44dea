// Checker, valid schemas: the layout model of the SCHEMA.md example, nested
// stacks and their scopes, conditions, defaults and the unused-parameter
// warning. (Every error class: errors/*.shard, see annotated_errors_test.cpp.)
#include "check/checker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "frontend_test_util.h"

namespace distckpt::gen {
namespace {

using testing::compile;
using testing::Compiled;
using testing::diagnostics_of;
using ::testing::ElementsAre;
using testing::kGptSchema;

std::string src(const Layout& layout, const ExprPtr& e) { return e ? to_source(*e, layout.params) : "<null>"; }

std::vector<std::string> keys_of(const Block& block) {
  std::vector<std::string> out;
  for (const Member& m : block.order) {
    switch (m.kind) {
      case Member::Kind::kTensor:
        out.push_back("tensor " + block.tensors[m.index].key);
        break;
      case Member::Kind::kObject:
        out.push_back("object " + block.objects[m.index].key);
        break;
      case Member::Kind::kStack:
        out.push_back("stack " + block.stacks[m.index]->key);
        break;
    }
  }
  return out;
}

void expect_split(const Split& split, int dim, std::vector<int> axes) {
  EXPECT_EQ(split.dim, dim);
  EXPECT_EQ(split.axes, axes);
}

TEST(Checker, SchemaExampleLayout) {
  const Compiled c = compile(kGptSchema);
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  EXPECT_TRUE(c.diagnostics.all().empty()) << c.diagnostics.render();
  const Layout& l = *c.layout;
  EXPECT_EQ(l.name, "gpt");
  EXPECT_EQ(l.file_name, "test.shard");
  EXPECT_EQ(l.source_text, kGptSchema);

  ASSERT_EQ(l.params.size(), 8u);
  const std::vector<std::string> names = {"hidden", "ffn",       "vocab",    "layers",
                                          "heads",  "kv_groups", "head_dim", "tie_embeddings"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(l.params[i].name, names[i]);
  EXPECT_EQ(l.params[0].default_value, nullptr);
  ASSERT_NE(l.params[5].default_value, nullptr);
  EXPECT_EQ(l.params[5].default_value->op, Expr::Op::kParam);
  EXPECT_EQ(l.params[5].default_value->param, 4);
  EXPECT_EQ(src(l, l.params[6].default_value), "hidden / heads");
  EXPECT_EQ(l.params[7].default_value->value, 0);
  EXPECT_EQ(l.params[6].loc.line, 10);
  EXPECT_EQ(l.params[6].loc.col, 3);
  EXPECT_EQ(l.mesh_axes, (std::vector<std::string>{"tp", "pp", "dp"}));

  EXPECT_THAT(keys_of(l.body), ElementsAre("tensor embedding.word_embeddings.weight", "stack decoder.layers",
                                           "tensor decoder.final_layernorm.weight", "tensor output_layer.weight",
                                           "tensor output_layer.weight"));
  const TensorDecl& embedding = l.body.tensors[0];
  EXPECT_EQ(embedding.accessor, "embedding_word_embeddings_weight");
  EXPECT_EQ(src(l, embedding.shape[0]), "vocab");
  ASSERT_EQ(embedding.splits.size(), 1u);
  expect_split(embedding.splits[0], 0, {0});
  EXPECT_EQ(embedding.pad_dim, 0);
  EXPECT_EQ(embedding.stage, Stage::kFirst);
  EXPECT_EQ(embedding.stage_axis, 1);
  EXPECT_EQ(embedding.condition.param, -1);
  EXPECT_EQ(embedding.loc.line, 16);
  EXPECT_EQ(embedding.loc.col, 8);

  const TensorDecl& final_norm = l.body.tensors[1];
  EXPECT_TRUE(final_norm.splits.empty());
  EXPECT_EQ(final_norm.stage, Stage::kLast);
  EXPECT_EQ(final_norm.stage_axis, 1);
  const TensorDecl& output = l.body.tensors[2];
  EXPECT_EQ(output.condition.param, 7);
  EXPECT_TRUE(output.condition.negate);
  EXPECT_TRUE(output.tied_key.empty());
  const TensorDecl& output_tied = l.body.tensors[3];
  EXPECT_EQ(output_tied.accessor, "output_layer_weight");
  EXPECT_EQ(output_tied.tied_key, "embedding.word_embeddings.weight");
  EXPECT_EQ(output_tied.condition.param, 7);
  EXPECT_FALSE(output_tied.condition.negate);
  EXPECT_EQ(output_tied.pad_dim, 0);

  ASSERT_EQ(l.body.stacks.size(), 1u);
  const StackDecl& layers = *l.body.stacks[0];
  EXPECT_EQ(layers.key, "decoder.layers");
  EXPECT_EQ(layers.accessor, "decoder_layers");
  EXPECT_EQ(layers.class_name, "DecoderLayers");
  EXPECT_EQ(src(l, layers.count), "layers");
  EXPECT_EQ(layers.axis, 1);
  EXPECT_EQ(layers.first_count, nullptr);
  EXPECT_EQ(layers.last_count, nullptr);
  EXPECT_FALSE(layers.as_keys);
  EXPECT_EQ(layers.condition.param, -1);
  EXPECT_THAT(keys_of(layers.body),
              ElementsAre("tensor self_attention.linear_qkv.weight", "tensor self_attention.linear_proj.weight",
                          "tensor input_layernorm.weight", "tensor mlp.linear_fc1.weight",
                          "tensor mlp.linear_fc2.weight", "object self_attention.core_attention._extra_state"));
  const TensorDecl& qkv = layers.body.tensors[0];
  EXPECT_EQ(qkv.accessor, "self_attention_linear_qkv_weight");
  EXPECT_EQ(src(l, qkv.shape[0]), "(heads + 2 * kv_groups) * head_dim");
  EXPECT_EQ(src(l, qkv.shape[1]), "hidden");
  expect_split(qkv.splits.at(0), 0, {0});
  ASSERT_EQ(qkv.fused.size(), 3u);
  EXPECT_EQ(qkv.fused[0].name, "q");
  EXPECT_EQ(src(l, qkv.fused[0].extent), "heads * head_dim");
  EXPECT_EQ(qkv.fused[2].name, "v");
  EXPECT_EQ(src(l, qkv.fused[2].extent), "kv_groups * head_dim");
  EXPECT_EQ(qkv.stage, Stage::kAll);
  EXPECT_EQ(qkv.stage_axis, -1);
  expect_split(layers.body.tensors[1].splits.at(0), 1, {0});
  EXPECT_TRUE(layers.body.tensors[2].splits.empty());
  const TensorDecl& fc1 = layers.body.tensors[3];
  ASSERT_EQ(fc1.fused.size(), 2u);
  EXPECT_EQ(fc1.fused[0].name, "w");
  EXPECT_EQ(src(l, fc1.fused[1].extent), "ffn");
  const ObjectDecl& extra = layers.body.objects.at(0);
  EXPECT_EQ(extra.accessor, "self_attention_core_attention__extra_state");
  EXPECT_EQ(extra.per_axes, std::vector<int>{0});

  ASSERT_EQ(l.optimizers.size(), 1u);
  EXPECT_EQ(l.optimizers[0].name, "adam");
  EXPECT_EQ(l.optimizers[0].states, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(l.optimizers[0].scalars, std::vector<std::string>{"step"});
  ASSERT_EQ(l.optimizers[0].distributions.size(), 1u);
  EXPECT_EQ(l.optimizers[0].distributions[0].mesh, 0);
  EXPECT_EQ(l.optimizers[0].distributions[0].axes, std::vector<int>{2});
  EXPECT_EQ(l.optimizers[0].distributions[0].instances, nullptr);
  ASSERT_EQ(l.commons.size(), 2u);
  EXPECT_EQ(l.commons[1].key, "consumed_samples");
  EXPECT_EQ(l.commons[1].accessor, "consumed_samples");
  EXPECT_EQ(l.commons[1].type, CommonDecl::Type::kInt);
  ASSERT_EQ(l.transients.size(), 1u);
  EXPECT_EQ(l.transients[0].key, "rng_tracker");
}

TEST(Checker, NestedStacksCarryTheirScope) {
  const Compiled c = compile(
      "layout moe;\n"
      "config { layers: int; experts: int; dense_first: int = 1; mtp: int = 0; }\n"
      "mesh tp, pp, ep, dp;\n"
      "stack decoder.layers[layers] over pp first(dense_first) last(layers / 4) as keys {\n"
      "  stack mlp.experts[experts] over ep when mtp {\n"
      "    tensor linear_fc1.weight [8, 4] split(0 by tp * dp) dtype(bfloat16);\n"
      "    object router_state per(tp, dp);\n"
      "  }\n"
      "}\n"
      // The same full key as the nested member, under the opposite condition.
      "tensor decoder.layers.mlp.experts.linear_fc1.weight [8] unless mtp;\n");
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  const Layout& l = *c.layout;
  const StackDecl& layers = *l.body.stacks.at(0);
  EXPECT_TRUE(layers.as_keys);
  EXPECT_EQ(src(l, layers.first_count), "dense_first");
  EXPECT_EQ(src(l, layers.last_count), "layers / 4");
  const StackDecl& experts = *layers.body.stacks.at(0);
  EXPECT_EQ(experts.key, "mlp.experts");
  EXPECT_EQ(experts.accessor, "mlp_experts");
  EXPECT_EQ(experts.class_name, "DecoderLayersMlpExperts");  // nested in Model: named after the full key
  EXPECT_EQ(experts.axis, 2);
  EXPECT_FALSE(experts.as_keys);
  EXPECT_EQ(experts.condition.param, 3);
  const TensorDecl& fc1 = experts.body.tensors.at(0);
  EXPECT_EQ(fc1.key, "linear_fc1.weight");  // relative to its stack
  expect_split(fc1.splits.at(0), 0, {0, 3});
  EXPECT_EQ(fc1.dtype, "bfloat16");
  EXPECT_EQ(experts.body.objects.at(0).per_axes, (std::vector<int>{0, 3}));
}

TEST(Checker, DefaultsMayReferToLaterOrUnsetParameters) {
  const Compiled c = compile(
      "layout t;\n"
      "config { a: int = b * 2; b: int = c; c: int; d: int = 6 / 3; }\n"
      "tensor w [a, d, 12 / d];\n");
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  EXPECT_TRUE(diagnostics_of(c, Diagnostic::Severity::kWarning).empty());
  EXPECT_EQ(src(*c.layout, c.layout->params[0].default_value), "b * 2");
  EXPECT_EQ(c.layout->params[1].default_value->param, 2);
}

TEST(Checker, ConfigBlocksMergeInOrder) {
  const Compiled c = compile("layout t;\nconfig { a: int; }\nconfig { b: int; }\ntensor w [a, b];\n");
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  ASSERT_EQ(c.layout->params.size(), 2u);
  EXPECT_EQ(c.layout->params[1].name, "b");
}

TEST(Checker, UnusedParameterIsAWarningOnly) {
  const Compiled c = compile("layout t;\nconfig {\n  used: int;\n  spare: int = 3;\n}\ntensor w [used];\n");
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  EXPECT_THAT(diagnostics_of(c, Diagnostic::Severity::kWarning),
              ElementsAre("4:3: config parameter 'spare' is never used"));
  EXPECT_TRUE(diagnostics_of(c).empty());
}

TEST(Checker, ParametersUsedOnlyInConditionsOrDefaultsCount) {
  const Compiled c = compile(
      "layout t;\nconfig { flag: int; base: int; derived: int = base; }\nmesh tp;\n"
      "tensor w [derived] when flag;\nobject o per(tp) unless flag;\n");
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  EXPECT_TRUE(c.diagnostics.all().empty()) << c.diagnostics.render();
  EXPECT_EQ(c.layout->body.objects.at(0).condition.param, 0);
  EXPECT_TRUE(c.layout->body.objects.at(0).condition.negate);
}

TEST(Checker, ScalarTensorsAndEmptyBlocks) {
  const Compiled c = compile("layout t;\nmesh dp;\ntensor loss_scale [];\noptimizer sgd { }\n");
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  EXPECT_TRUE(c.layout->body.tensors.at(0).shape.empty());
  EXPECT_TRUE(c.layout->optimizers.at(0).distributions.empty());
}

// Megatron-scale layouts: virtual pipeline stages with an explicit layout,
// a stack placed on the last stage, two meshes sharing pp, and the
// distributed optimizer over a product of axes per mesh.
TEST(Checker, VirtualStagesMeshesAndDistributedGroups) {
  const Compiled c = compile(
      "layout t;\nconfig { layers: int; vp: int = 2; counts: int[]; n: int = 2; e: int = 4; mtp: int = 0; }\n"
      "mesh tp, cp, dp, pp;\nmesh experts: etp, ep, edp, pp;\n"
      "stack layers[layers] over pp virtual(vp) layout(counts) {\n"
      "  tensor w [8] split(0 by tp);\n"
      "  stack experts[e] over ep on experts { tensor fc [8, 8] split(1 by etp); }\n"
      "}\n"
      "stack mtp[mtp] stage(last) { tensor norm [8]; }\n"
      "optimizer adam { state exp_avg like param; distributed over dp * cp instances(n); distributed over edp on "
      "experts; "
      "}\n");
  ASSERT_TRUE(c.layout.has_value()) << c.diagnostics.render();
  const Layout& l = *c.layout;
  EXPECT_EQ(l.mesh_axes, (std::vector<std::string>{"tp", "cp", "dp", "pp", "etp", "ep", "edp"}));
  ASSERT_EQ(l.meshes.size(), 2u);
  EXPECT_EQ(l.meshes[0].name, "default");
  EXPECT_EQ(l.meshes[1].name, "experts");
  EXPECT_EQ(l.meshes[1].axes, (std::vector<int>{4, 5, 6, 3}));  // pp shared
  EXPECT_TRUE(l.params[2].list);
  const StackDecl& layers = *l.body.stacks.at(0);
  EXPECT_EQ(l.chunked_stack, &layers);
  EXPECT_EQ(src(l, layers.chunks), "vp");
  EXPECT_EQ(layers.layout_param, 2);
  const StackDecl& experts = *layers.body.stacks.at(0);
  EXPECT_EQ(experts.mesh, 1);
  EXPECT_EQ(experts.body.tensors.at(0).mesh, 1);  // inherited from the stack
  EXPECT_EQ(layers.body.tensors.at(0).mesh, 0);
  const StackDecl& mtp = *l.body.stacks.at(1);
  EXPECT_EQ(mtp.axis, -1);
  EXPECT_EQ(mtp.stage, Stage::kLast);
  EXPECT_EQ(mtp.stage_axis, 3);
  const OptimizerDecl& adam = l.optimizers.at(0);
  ASSERT_EQ(adam.distributions.size(), 2u);
  EXPECT_EQ(adam.distributions[0].axes, (std::vector<int>{2, 1}));  // dp major
  EXPECT_EQ(src(l, adam.distributions[0].instances), "n");
  EXPECT_EQ(adam.distributions[1].mesh, 1);
  EXPECT_EQ(adam.distributions[1].axes, std::vector<int>{6});
}

TEST(Checker, CompileSchemaStopsAfterSyntaxErrors) {
  // The unknown name on line 3 is not reported: the checker only sees a clean parse.
  const Compiled c = compile("layout t;\ntensor a [1;\ntensor b [unknown];\n");
  EXPECT_FALSE(c.layout.has_value());
  EXPECT_THAT(diagnostics_of(c), ElementsAre("2:12: expected ',' or ']' in the tensor shape (found ';')"));
}

}  // namespace
}  // namespace distckpt::gen
