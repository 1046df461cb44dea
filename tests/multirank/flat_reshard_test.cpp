// Flattened (ZeRO) ranges across layouts, after Megatron-Core's flattened
// resharding suite: a global 8x5x40 arange tensor, TP splitting dim 0, PP
// splitting dim 2, and DP splitting each flattened local chunk into uneven
// slices. Saved with 8 ranks under one (tp, pp), loaded under another.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

constexpr int kWorld = 8;
const Shape kGlobal{8, 5, 40};

struct Layout {
  int64_t tp, pp;
  int64_t dp() const { return kWorld / (tp * pp); }
};

// Uneven cut points of n elements into dp slices, weights 1, 2, 3, ...
std::vector<int64_t> uneven_cuts(int64_t n, int64_t dp) {
  const int64_t total_weight = dp * (dp + 1) / 2;
  std::vector<int64_t> cuts{0};
  int64_t weight = 0;
  for (int64_t i = 1; i <= dp; ++i) {
    weight += i;
    cuts.push_back(n * weight / total_weight);
  }
  return cuts;
}

// This rank's flat slice of its (tp, pp) chunk of the arange tensor.
ShardedTensor flat_shard(const Layout& l, int rank) {
  const int64_t dp_rank = rank % l.dp(), tp_rank = (rank / l.dp()) % l.tp, pp_rank = rank / (l.dp() * l.tp);
  const at::Tensor global = at::arange(numel(kGlobal), at::kFloat).reshape(kGlobal);
  const Shape local{8 / l.tp, 5, 40 / l.pp};
  const at::Tensor chunk = global.narrow(0, tp_rank * local[0], local[0]).narrow(2, pp_rank * local[2], local[2]);
  const std::vector<int64_t> cuts = uneven_cuts(numel(local), l.dp());
  const FlatRange range{cuts[dp_rank], cuts[dp_rank + 1]};
  return ShardedTensor::from_rank_offsets_flat("optimizer.state.exp_avg.w",
                                               chunk.flatten().slice(0, range.start, range.stop).clone(), local,
                                               {{0, tp_rank, l.tp}, {2, pp_rank, l.pp}}, range);
}

void save_then_load(const Layout& saved, const Layout& loaded) {
  TempDir tmp("flat-reshard");
  const std::string dir = tmp.path() + "/ckpt";
  run_ranks(kWorld, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = flat_shard(saved, comm.rank());
    save(sd, dir, comm);
  });
  run_ranks(kWorld, [&](Communicator& comm) {
    const ShardedTensor expected = flat_shard(loaded, comm.rank());
    StateDict request = Value::dict();
    request["w"] = expected.without_data();
    const at::Tensor got = load(request, dir, comm).state_dict.at("w").as_tensor();
    EXPECT_TRUE(at::equal(got, expected.data)) << "rank " << comm.rank() << " loading (tp " << loaded.tp << ", pp "
                                               << loaded.pp << ") from (tp " << saved.tp << ", pp " << saved.pp << ")";
  });
}

TEST(FlatReshard, Tp2Pp4ToTp2Pp4) { save_then_load({2, 4}, {2, 4}); }
TEST(FlatReshard, Tp2Pp4ToTp2Pp2) { save_then_load({2, 4}, {2, 2}); }
TEST(FlatReshard, Tp2Pp4ToTp4Pp2) { save_then_load({2, 4}, {4, 2}); }
TEST(FlatReshard, Tp8Pp1ToTp1Pp2) { save_then_load({8, 1}, {1, 2}); }
TEST(FlatReshard, Tp1Pp2Dp4ToTp2Pp2Dp2) { save_then_load({1, 2}, {2, 2}); }

// Validation names the chunk and the ranks when flat ranges leave a gap or overlap.
TEST(FlatReshard, GapsAndOverlapsInFlatRangesAreRejected) {
  TempDir tmp("flat-invalid");
  for (const bool overlap : {false, true}) {
    run_ranks(2, [&](Communicator& comm) {
      // Chunk of 10 elements: rank 0 holds [0, 4); rank 1 holds [5, 10) (gap) or [3, 10) (overlap).
      const FlatRange range = comm.rank() == 0 ? FlatRange{0, 4} : FlatRange{overlap ? 3 : 5, 10};
      StateDict sd = Value::dict();
      sd["w"] = ShardedTensor::from_rank_offsets_flat("w", at::zeros({range.size()}), {2, 5}, {}, range);
      try {
        save(sd, tmp.path() + (overlap ? "/overlap" : "/gap"), comm);
        ADD_FAILURE() << "expected an error";
      } catch (const Error& e) {
        const std::string want = overlap ? "flattened ranges [0, 4) on rank 0 and [3, 10) on rank 1 overlap in the "
                                           "chunk offset [0, 0] length [2, 5]"
                                         : "flattened range [4, 5) of the chunk offset [0, 0] length [2, 5] is held by "
                                           "no rank";
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      }
    });
  }
}

}  // namespace
}  // namespace distckpt
