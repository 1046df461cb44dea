// The API generated from schema/models/gpt.shard: shapes checked against
// the schema, replica ids and stages derived from the mesh, fused tensors
// as factories, tied embeddings, and a save/load across meshes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/ordered_dict.h>

#include "distckpt/layout/from_global.h"
#include "gpt.shard.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

gpt::Config small_config(int64_t tie = 0) {
  gpt::Config c;
  c.hidden = 16;
  c.ffn = 32;
  c.vocab = 64;
  c.layers = 4;
  c.heads = 4;
  c.kv_groups = 2;
  c.tie_embeddings = tie;
  return c;
}

// The generated Mesh is {tp, cp, dp, pp}; these tests use no context parallelism.
gpt::Mesh mesh(distckpt::layout::AxisCoord tp, distckpt::layout::AxisCoord pp, distckpt::layout::AxisCoord dp) {
  return gpt::Mesh{tp, {0, 1}, dp, pp};
}

// Fills every tensor this rank holds with its slice of deterministic globals.
void fill(gpt::Model& m) {
  const StateDict meta = m.metadata_state_dict();
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& [name, entry] : meta.as_dict()) {
    if (entry.kind() == Kind::kShardedObject) continue;
    params.emplace_back(name, layout::local_from_global(entry, [](const std::string& key, const Shape& shape) {
                          return testing::global_tensor(key, shape);
                        }));
  }
  m.bind(params);
  for (int64_t l = 0; l < m.decoder_layers_local_count(); ++l) {
    m.decoder_layers(l).self_attention_core_attention__extra_state("x");
  }
  m.iteration(5).consumed_samples(160);
}

TEST(GeneratedLayout, ResolvesConfigDefaultsAndReportsMissingParameters) {
  gpt::Model m(small_config(), mesh({0, 1}, {0, 1}, {0, 1}));
  EXPECT_EQ(m.config().head_dim, 4);  // hidden / heads
  EXPECT_EQ(m.config().kv_groups, 2);
  gpt::Config incomplete;
  incomplete.hidden = 16;
  try {
    gpt::Model bad(incomplete, mesh({0, 1}, {0, 1}, {0, 1}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ffn', 'vocab', 'layers', 'heads'"), std::string::npos) << e.what();
  }
  gpt::Config odd = small_config();
  odd.heads = 3;
  try {
    gpt::Model bad(odd, mesh({0, 1}, {0, 1}, {0, 1}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'hidden / heads' is 16 / 3"), std::string::npos) << e.what();
  }
}

TEST(GeneratedLayout, StagesReplicaIdsAndLocalShapesFollowTheMesh) {
  // tp rank 1 of 2, last of 2 pp stages, dp rank 1 of 2.
  gpt::Model m(small_config(), mesh({1, 2}, {1, 2}, {1, 2}));
  EXPECT_FALSE(m.holds_embedding_word_embeddings_weight());
  EXPECT_TRUE(m.holds_output_layer_weight());
  ASSERT_EQ(m.decoder_layers_local_count(), 2);
  EXPECT_EQ(m.decoder_layers(0).global_index(), 2);
  const StateDict meta = m.metadata_state_dict();
  const ShardedTensor& proj = meta.at("model0.decoder.layers.1.self_attention.linear_proj.weight").as_sharded_tensor();
  EXPECT_EQ(proj.key, "decoder.layers.self_attention.linear_proj.weight");
  EXPECT_EQ(proj.global_shape, (Shape{4, 16, 16}));
  EXPECT_EQ(proj.global_offset, (Shape{3, 0, 8}));  // layer 3, second half of the columns
  EXPECT_EQ(proj.local_shape, (Shape{16, 8}));
  EXPECT_EQ(proj.replica_id, (ReplicaId{0, 1}));  // replicated over cp and dp only
  const ShardedTensor& norm = meta.at("model0.decoder.final_layernorm.weight").as_sharded_tensor();
  EXPECT_EQ(norm.replica_id, (ReplicaId{1, 0, 1}));  // over tp, cp and dp, not pp (placed on the last stage)
  EXPECT_TRUE(meta.at("model0.output_layer.weight").as_sharded_tensor().allow_shape_mismatch);
  // The fused QKV is a factory whose parts land in [q; k; v] of the global tensor.
  const Value parts = meta.at("model0.decoder.layers.0.self_attention.linear_qkv.weight").as_factory().build_subtree();
  EXPECT_EQ(parts.at("q").as_sharded_tensor().global_offset, (Shape{2, 8, 0}));
  EXPECT_EQ(parts.at("k").as_sharded_tensor().global_offset, (Shape{2, 16 + 4, 0}));
  EXPECT_EQ(parts.at("v").as_sharded_tensor().global_offset, (Shape{2, 24 + 4, 0}));
  EXPECT_EQ(parts.at("v").as_sharded_tensor().local_shape, (Shape{4, 16}));
}

TEST(GeneratedLayout, TiedOutputLayerIsANonMainReplicaOfTheEmbedding) {
  gpt::Model m(small_config(/*tie=*/1), mesh({0, 1}, {0, 1}, {0, 1}));
  const StateDict meta = m.metadata_state_dict();
  const ShardedTensor& out = meta.at("model0.output_layer.weight").as_sharded_tensor();
  EXPECT_EQ(out.key, "embedding.word_embeddings.weight");
  EXPECT_FALSE(out.is_main_replica());
  EXPECT_TRUE(meta.at("model0.embedding.word_embeddings.weight").as_sharded_tensor().is_main_replica());
}

TEST(GeneratedLayout, SettersCheckShapesAndNameTheSchemaKey) {
  gpt::Model m(small_config(), mesh({0, 2}, {0, 2}, {0, 1}));
  try {
    m.decoder_layers(1).mlp_linear_fc2_weight(at::zeros({16, 32}));
    ADD_FAILURE();
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "'decoder.layers.mlp.linear_fc2.weight' (decoder.layers 1) expects a local "
                  "tensor of shape [16, 16] on this rank (tp 0/2, cp 0/1, dp 0/1, pp 0/2), got [16, 32]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(m.output_layer_weight(at::zeros({32, 16})), Error);  // lives on the last stage
  try {
    m.state_dict();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not set on this rank"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'model0.embedding.word_embeddings.weight'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.bind({{"decoder.layers.0.unknown.weight", at::zeros({1})}}), Error);
}

// bind(module->named_parameters()) as written in the docs: a LibTorch
// OrderedDict binds like the vector of pairs it holds.
TEST(GeneratedLayout, BindTakesWhatALibTorchModuleReturns) {
  gpt::Model m(small_config(), mesh({0, 2}, {0, 2}, {0, 1}));
  const at::Tensor fc2 = at::full({16, 16}, 3.0);
  torch::OrderedDict<std::string, at::Tensor> whole, chunk;  // bind() takes state-dict names, bind_chunk() the chunk's
  whole.insert("model0.decoder.layers.0.mlp.linear_fc2.weight", fc2);
  chunk.insert("decoder.layers.0.mlp.linear_fc2.weight", fc2);
  m.bind(whole);
  m.bind_chunk(0, chunk);
  torch::OrderedDict<std::string, at::Tensor> unknown;
  unknown.insert("decoder.layers.0.unknown.weight", at::zeros({1}));
  EXPECT_THROW(m.bind(unknown), Error);
  EXPECT_THROW(m.bind_chunk(0, unknown), Error);
  // Everything else is still missing, one entry fewer than on a model nothing was bound to.
  const auto missing = [](const gpt::Model& model) {
    try {
      model.state_dict();
    } catch (const Error& e) {
      const std::string text = e.what();
      const size_t at = text.find("cannot build the state dict, ");
      return at == std::string::npos ? -1 : std::stoi(text.substr(at + 29));
    }
    return 0;
  };
  gpt::Model fresh(small_config(), mesh({0, 2}, {0, 2}, {0, 1}));
  EXPECT_GT(missing(fresh), 1);
  EXPECT_EQ(missing(m), missing(fresh) - 1);
}

TEST(GeneratedLayout, SaveUnderOneMeshLoadWithoutAModelUnderAnother) {
  TempDir tmp("generated");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(8, [&](Communicator& comm) {
    const int r = comm.rank();
    gpt::Model m(small_config(), mesh({r % 2, 2}, {r / 4, 2}, {(r / 2) % 2, 2}));  // tp, pp, dp
    fill(m);
    save(m.state_dict(), dir, comm, m.save_options());
  });
  const StateDict plain = load_plain_tensors(dir);
  EXPECT_TRUE(at::equal(plain.at("decoder.layers.mlp.linear_fc1.weight").as_tensor(),
                        testing::global_tensor("decoder.layers.mlp.linear_fc1.weight", {4, 64, 16})));
  run_ranks(2, [&](Communicator& comm) {
    gpt::Model m(small_config(), mesh({0, 1}, {comm.rank(), 2}, {0, 1}));
    LoadResult r = load(m.metadata_state_dict(), dir, comm, {StrictHandling::kReturnUnexpected});
    gpt::Model expected(small_config(), mesh({0, 1}, {comm.rank(), 2}, {0, 1}));
    fill(expected);
    const StateDict want = expected.state_dict();
    for (const auto& [name, entry] : want.as_dict()) {
      if (entry.kind() == Kind::kShardedTensor) {
        EXPECT_TRUE(at::equal(r.state_dict.at(name).as_tensor(), entry.as_sharded_tensor().data)) << name;
      } else if (entry.kind() == Kind::kFactory) {
        EXPECT_TRUE(at::equal(r.state_dict.at(name).as_tensor(), entry.as_factory().data)) << name;
      }
    }
    EXPECT_EQ(r.state_dict.at("consumed_samples").as_int(), 160);
    // extra_state was saved per tp rank of 2, so tp=1 shards of it are not stored.
    // Reported by key (the shards asked for are on another grid than stored).
    EXPECT_EQ(r.unexpected_keys, (std::set<std::string>{"decoder.layers.self_attention.core_attention._extra_state"}));
  });
}

}  // namespace
}  // namespace distckpt
