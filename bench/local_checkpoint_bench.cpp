// Local (node-level) checkpoints next to the global checkpoint of the same
// state on the same disk, measured in the same run:
//   global save        distckpt::save (fully parallel, committed)
//   local save         LocalCheckpointManager::save, no replication
//   local save + F=2   the same with clique replication (one rank per "node")
//   load (intact)      find_latest + load + to_state_dict
//   recovery           the same after the directories of half the ranks
//                      (a "node") were deleted: their state comes from peers
// Run under distckpt-launch -n N (N even for replication). Median of --reps.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>

#include "bench_timer.h"
#include "distckpt/distckpt.h"
#include "io/file.h"

namespace {

using namespace distckpt;

// GPT-like layers (qkv, proj, fc1, fc2) of width `hidden`, rows split over the
// ranks, and layer norms replicated on every rank.
StateDict make_state(int64_t total_mb, int64_t hidden, int rank, int world, bool with_data) {
  StateDict sd = Value::dict();
  const uint64_t target = static_cast<uint64_t>(total_mb) << 20;
  uint64_t bytes = 0;
  for (int layer = 0; bytes < target; ++layer) {
    for (const auto& [name, rows] : std::vector<std::pair<std::string, int64_t>>{
             {"qkv", 3 * hidden}, {"proj", hidden}, {"fc1", 4 * hidden}, {"fc2", 4 * hidden}}) {
      const std::string key = fmt::format("layers.{}.{}", layer, name);
      // Load destinations are a resumed trainer's tensors: allocated and touched.
      at::Tensor t = with_data ? at::rand({rows / world, hidden}) : at::zeros({rows / world, hidden});
      sd[key] = ShardedTensor::from_rank_offsets(key, t, {{0, rank, world}});
      bytes += static_cast<uint64_t>(rows * hidden) * 4;
    }
    const std::string norm = fmt::format("layers.{}.norm", layer);
    sd[norm] = ShardedTensor::from_rank_offsets(norm, at::ones({hidden}), {}, {rank});
  }
  sd["iteration"] = 1;
  return sd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"local checkpoints vs the global checkpoint of the same state"};
  int64_t total_mb = 1024, hidden = 1024;
  int reps = 3;
  std::string dir = "bench-local";
  app.add_option("--mb", total_mb, "global state size in MiB");
  app.add_option("--hidden", hidden, "hidden size");
  app.add_option("--reps", reps, "repetitions (median reported)");
  app.add_option("--dir", dir, "scratch directory");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  auto comm = std::getenv("WORLD_SIZE") ? communicator_from_env() : make_single_process_communicator();
  const int rank = comm->rank(), world = comm->size();
  const StateDict state = make_state(total_mb, hidden, rank, world, true);
  const StateDict request = make_state(total_mb, hidden, rank, world, false);
  if (rank == 0) {
    io::remove_tree(dir);
    io::make_dirs(dir);
  }
  comm->barrier();
  LocalCheckpointOptions replicated;
  if (world % 2 == 0) replicated.replication = CliqueReplication{world / 2, 2};  // two "nodes"
  auto cache = ShardDistributionCache::create();
  bench::Timer global(*comm), local(*comm), local_f2(*comm), load_intact(*comm), recovery(*comm);
  for (int rep = 0; rep < reps; ++rep) {
    const std::string g = fmt::format("{}/global_{}", dir, rep), l = fmt::format("{}/local_{}", dir, rep),
                      lr = fmt::format("{}/replicated_{}", dir, rep);
    global.run([&] { save(state, g, *comm); });
    local.run([&] {
      LocalCheckpointManager m(l, *comm);
      m.save(TensorAwareStateDict::from_state_dict(state, *comm, TensorAwareAlgo::kFullyParallel, cache), 1);
    });
    if (!replicated.replication) continue;
    local_f2.run([&] {
      LocalCheckpointManager m(lr, *comm, replicated);
      m.save(TensorAwareStateDict::from_state_dict(state, *comm, TensorAwareAlgo::kFullyParallel, cache), 1);
    });
    load_intact.run([&] {
      LocalCheckpointManager m(lr, *comm, replicated);
      m.load().to_state_dict(request, *comm);
    });
    // Node 1 (the upper half of the ranks) is replaced by an empty one.
    if (rank >= world / 2) io::remove_tree(fmt::format("{}/rank_{}", lr, rank));
    comm->barrier();
    recovery.run([&] {
      LocalCheckpointManager m(lr, *comm, replicated);
      m.load().to_state_dict(request, *comm);
      if (m.last_recovery().recovered_ranks.size() != static_cast<size_t>(world / 2)) std::abort();
    });
  }
  if (rank == 0) {
    const double gs = global.median(), ls = local.median();
    fmt::print("ranks {}  state {} MiB  median of {}\n", world, total_mb, reps);
    fmt::print("| operation | seconds | vs global save |\n|---|---|---|\n");
    fmt::print("| global save (committed) | {:.3f} | 1.00 |\n", gs);
    fmt::print("| local save | {:.3f} | {:.2f}x faster |\n", ls, gs / ls);
    if (replicated.replication) {
      const double f2 = local_f2.median(), li = load_intact.median(), rc = recovery.median();
      fmt::print("| local save + replicas (F=2) | {:.3f} | {:.2f}x faster |\n", f2, gs / f2);
      fmt::print("| local load, intact | {:.3f} | |\n", li);
      fmt::print("| local load after losing half the ranks (recovery) | {:.3f} | {:.2f}x intact load |\n", rc, rc / li);
    }
  }
  comm->barrier();
  if (rank == 0) io::remove_tree(dir);
  return 0;
}
