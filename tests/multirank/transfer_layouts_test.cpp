// transfer() between the layouts a job really changes to: a trained GPT with
// its Adam state onto another tensor-parallel mesh, ZeRO-1 state onto fewer
// data-parallel ranks (other flat ranges), and MoE experts onto fewer
// expert-parallel ranks. The values expected are those of a reference built
// directly on the destination's mesh from the same deterministic globals.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "moe.shard.h"
#include "multirank/transfer_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::deterministic_global;
using testing::expect_tensors_equal;
using testing::gpt_mesh;
using testing::VerifiedDigests;

gpt::Config gpt_config() { return testing::transfer_gpt_config(); }

struct Gpt {
  std::unique_ptr<gpt::Model> model;
  std::vector<at::Tensor> params;  // bound to the model, in the Adam's id order
  std::unique_ptr<torch::optim::Adam> adam;
};

// A GPT whose parameters are their slices of deterministic globals, with an Adam that has no state yet.
Gpt fresh_gpt(const gpt::Mesh& mesh) {
  Gpt g{std::make_unique<gpt::Model>(gpt_config(), mesh), {}, nullptr};
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& [name, entry] : g.model->metadata_state_dict().as_dict()) {
    if (entry.kind() == Kind::kShardedObject) continue;
    at::Tensor p = layout::local_from_global(entry, deterministic_global).requires_grad_(true);
    named.emplace_back(name, p);
    g.params.push_back(p);
  }
  g.model->bind(named);
  for (int64_t l = 0; l < g.model->decoder_layers_local_count(); ++l) {
    g.model->decoder_layers(l).self_attention_core_attention__extra_state("x");
  }
  g.adam = std::make_unique<torch::optim::Adam>(g.params, torch::optim::AdamOptions(0.01));
  return g;
}

// One Adam step with grad = param. Adam is elementwise, so every mesh of the
// same globals reaches the same logical weights, exp_avg and exp_avg_sq.
Gpt trained_gpt(const gpt::Mesh& mesh) {
  Gpt g = fresh_gpt(mesh);
  for (auto& p : g.params) p.mutable_grad() = p.detach().clone();
  g.adam->step();
  return g;
}

// What a save would write: the weights and the ZeRO-1 Adam state (flat ranges over dp * cp).
StateDict gpt_sources(const Gpt& g) {
  StateDict sd = g.model->state_dict();
  merge(sd, gpt::Adam(*g.model).state_dict(*g.adam));
  return sd;
}

// What a restarted job asks for: its weights (they hold data: filled in place)
// and each parameter's whole local Adam state, as for a load.
StateDict gpt_request(const Gpt& g) {
  StateDict sd = g.model->state_dict();
  merge(sd, gpt::Adam(*g.model).load_request(*g.adam));
  return sd;
}

// Weights and Adam state equal a reference's, trained on the destination's
// mesh. A transfer moves no plain values, and Adam::load_state_dict needs the
// optimizer's "step" (layout::torch_optimizer_state reads it), so the state
// is compared as transferred, against the reference's whole local state.
void expect_gpt_equal(const StateDict& got, const Gpt& reference, int rank) {
  expect_tensors_equal(got, reference.model->state_dict(), rank);
  const StateDict want = gpt::Adam(*reference.model, /*distributed=*/false).state_dict(*reference.adam);
  const Value& state = got.at("optimizer").at("state");
  size_t compared = 0;
  for (const auto& [param, entries] : want.at("optimizer").at("state").as_dict()) {
    for (const auto& [name, entry] : entries.as_dict()) {
      EXPECT_TRUE(at::equal(state.at(param).at(name).as_tensor(), testing::data_of(entry)))
          << "rank " << rank << ": " << param << " " << name;
      ++compared;
    }
  }
  EXPECT_EQ(state.size(), reference.params.size());
  EXPECT_EQ(compared, 2 * reference.params.size());  // exp_avg and exp_avg_sq of every parameter
}

TEST(TransferLayouts, GptWithAdamFromTp2Pp2ToTp4OnTheSameRanks) {
  TempDir tmp("transfer-layouts");
  const std::string dir = tmp.path() + "/ckpt";
  VerifiedDigests verified;
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    const Gpt source = trained_gpt(gpt_mesh({r % 2, 2}, {r / 2, 2}));
    const StateDict sources = gpt_sources(source);
    save(sources, dir, comm, source.model->save_options());  // for the digests to compare with
    const Gpt destination = fresh_gpt(gpt_mesh({r, 4}, {0, 1}));
    const TransferResult result = transfer(sources, gpt_request(destination), comm);
    const Gpt reference = trained_gpt(gpt_mesh({r, 4}, {0, 1}));
    expect_gpt_equal(result.state_dict, reference, r);
    // The fresh model's own parameters (requested with data) now hold the trained weights.
    ASSERT_EQ(destination.params.size(), reference.params.size());
    for (size_t i = 0; i < reference.params.size(); ++i) {
      EXPECT_TRUE(at::equal(destination.params[i], reference.params[i])) << "rank " << r << ": parameter " << i;
    }
    verified.add(result);
  });
  verified.expect_equal_to(digest_checkpoint(dir));
}

// ZeRO-1 over dp 8, then over dp 6: each rank's flat ranges (the padded
// concatenation cut in 8, then in 6 parts) cover other elements of other
// parameters, so the pieces are cut anew on both sides.
TEST(TransferLayouts, ZeroOptimizerStateShrinksFromEightToSixRanks) {
  VerifiedDigests verified;
  run_ranks(8, [&](Communicator& comm) {
    const int r = comm.rank();
    const bool stays = r < 6;
    const Gpt source = trained_gpt(gpt_mesh({0, 1}, {0, 1}, {r, 8}));
    Gpt destination;
    StateDict requests = Value::dict();  // ranks 6 and 7 leave the job: they only send
    if (stays) {
      destination = fresh_gpt(gpt_mesh({0, 1}, {0, 1}, {r, 6}));
      requests = gpt_request(destination);
    }
    const TransferResult result = transfer(gpt_sources(source), requests, comm);
    if (stays) {
      const Gpt reference = trained_gpt(gpt_mesh({0, 1}, {0, 1}, {r, 6}));
      expect_gpt_equal(result.state_dict, reference, r);
      verified.expect_verified(reference.model->state_dict());
      verified.expect_verified(gpt::Adam(*reference.model, /*distributed=*/false).state_dict(*reference.adam));
    } else {
      // Their flat ranges exist nowhere else (ZeRO keeps no replica over dp): they must send them.
      EXPECT_GT(result.source_bytes_read, 0u) << "rank " << r;
    }
    verified.add(result);
  });
  verified.check();
}

moe::Config moe_config() {
  moe::Config c;
  c.hidden = 16;
  c.ffn = 8;
  c.vocab = 32;
  c.layers = 2;
  c.heads = 4;
  c.experts = 8;
  return c;
}

// Dense weights on (tp 1, cp 1, dp, pp 1), experts on (etp 1, ep, edp 1, pp 1)
// of the same ranks: the schema wants both meshes to cover the same ranks, so dp = ep.
moe::Mesh moe_mesh(layout::AxisCoord ep) { return moe::Mesh{{0, 1}, {0, 1}, ep, {0, 1}, {0, 1}, ep, {0, 1}}; }

std::unique_ptr<moe::Model> filled_moe(const moe::Mesh& m) {
  auto model = std::make_unique<moe::Model>(moe_config(), m);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& [name, entry] : model->metadata_state_dict().as_dict()) {
    if (entry.kind() == Kind::kShardedObject) continue;  // the schema declares none; kept for symmetry with GPT
    params.emplace_back(name, layout::local_from_global(entry, deterministic_global));
  }
  model->bind(params);
  return model;
}

// Ranks 0 and 1 alone form the destination mesh (dp 2 = ep 2, edp 1): the
// generated Mesh is only this rank's coordinates and the schema asks only
// that both meshes have the same number of ranks, so a 2-rank mesh inside
// the 4-rank job is valid, and a transfer's destinations need not be every
// rank (ranks 2 and 3 ask for nothing). Each destination holds 4 experts per
// layer, gathered from two source ranks of 2 experts each.
TEST(TransferLayouts, MoeExpertsFromEp4ToEp2) {
  VerifiedDigests verified;
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    const bool receives = r < 2;
    const auto source = filled_moe(moe_mesh({r, 4}));
    EXPECT_EQ(source->decoder_layers(0).mlp_experts_local_count(), 2);
    std::unique_ptr<moe::Model> destination;
    StateDict requests = Value::dict();
    if (receives) {
      destination = std::make_unique<moe::Model>(moe_config(), moe_mesh({r, 2}));
      EXPECT_EQ(destination->decoder_layers(0).mlp_experts_local_count(), 4);
      requests = destination->metadata_state_dict();
    }
    const TransferResult result = transfer(source->state_dict(), requests, comm);
    if (receives) {
      const auto reference = filled_moe(moe_mesh({r, 2}));
      expect_tensors_equal(result.state_dict, reference->state_dict(), r);
      verified.expect_verified(reference->state_dict());
    }
    verified.add(result);
  });
  verified.check();
}

}  // namespace
}  // namespace distckpt
