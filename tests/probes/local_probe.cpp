// distckpt_local_probe: one rank of a job started by distckpt-launch, for the
// e2e tests of local checkpoints with real processes.
//   distckpt_local_probe ROOT save ITERATION [--ranks-per-node J --factor F] [--async]
//   distckpt_local_probe ROOT load EXPECTED_ITERATION [--ranks-per-node J --factor F]
// The state is a deterministic function of (rank, world, iteration); load
// compares every loaded byte with it and prints one line per rank:
//   "rank R loaded iteration I bitwise-equal recovered=[...]"
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "distckpt/distckpt.h"

namespace {

using namespace distckpt;

at::Tensor values(int64_t seed, at::IntArrayRef shape) {
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return at::rand(shape, gen);
}

StateDict model(int rank, int world, int64_t iteration, bool with_data) {
  StateDict sd = Value::dict();
  at::Tensor w = values(1000 * iteration + rank, {64, 128});
  at::Tensor norm = values(iteration, {128});
  sd["w"] = ShardedTensor::from_rank_offsets("w", with_data ? w : at::zeros_like(w), {{0, rank, world}});
  sd["norm"] = ShardedTensor::from_rank_offsets("norm", with_data ? norm : at::zeros_like(norm), {}, {rank});
  sd["rng"] = ShardedObject{"rng", fmt::format("rng-{}-{}", rank, iteration), {world}, {rank}};
  sd["iteration"] = iteration;
  return sd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"local checkpoint probe"};
  std::string root, action;
  int64_t iteration = 0;
  int ranks_per_node = 0, factor = 0;
  bool async = false;
  app.add_option("root", root)->required();
  app.add_option("action", action)->required()->check(CLI::IsMember({"save", "load"}));
  app.add_option("iteration", iteration)->required();
  app.add_option("--ranks-per-node", ranks_per_node);
  app.add_option("--factor", factor);
  app.add_flag("--async", async);
  CLI11_PARSE(app, argc, argv);
  int rank = -1;
  try {
    auto comm = communicator_from_env();
    rank = comm->rank();
    LocalCheckpointOptions options;
    if (factor > 0) options.replication = CliqueReplication{ranks_per_node, factor};
    LocalCheckpointManager manager(root, *comm, options);
    if (action == "save") {
      const auto tasd = TensorAwareStateDict::from_state_dict(model(rank, comm->size(), iteration, true), *comm,
                                                              TensorAwareAlgo::kFullyParallel);
      if (async) {
        AsyncCallsQueue queue(*comm);
        manager.save_async(tasd, iteration, queue);
        queue.close();
      } else {
        manager.save(tasd, iteration);
      }
      std::cout << fmt::format("rank {} saved iteration {}\n", rank, iteration);
      return 0;
    }
    const TensorAwareStateDict loaded = manager.load();
    const LoadResult r = loaded.to_state_dict(model(rank, comm->size(), iteration, false), *comm);
    const StateDict expected = model(rank, comm->size(), iteration, true);
    const bool equal = manager.last_recovery().iteration == iteration &&
                       at::equal(r.state_dict.at("w").as_tensor(), expected.at("w").as_sharded_tensor().data) &&
                       at::equal(r.state_dict.at("norm").as_tensor(), expected.at("norm").as_sharded_tensor().data) &&
                       r.state_dict.at("rng").as_string() == fmt::format("rng-{}-{}", rank, iteration);
    std::cout << fmt::format("rank {} loaded iteration {} {} recovered=[{}]\n", rank, manager.last_recovery().iteration,
                             equal ? "bitwise-equal" : "DIFFERENT",
                             fmt::join(manager.last_recovery().recovered_ranks, ","));
    return equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << fmt::format("rank {}: {}\n", rank, e.what());
    return 1;
  }
}
