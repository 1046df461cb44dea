// distckpt_local_probe: one rank of a job started by distckpt-launch, for the
// e2e tests of local checkpoints with real processes.
//   distckpt_local_probe ROOT save ITERATION [--ranks-per-node J --factor F] [--async] [--run S]
//   distckpt_local_probe ROOT load EXPECTED_ITERATION [--ranks-per-node J --factor F]
// The state is a deterministic function of (rank, world, iteration, run): S
// tells apart two runs' states at the same iteration (a job that resumed from
// an older state). load takes the latest complete iteration (EXPECTED "latest":
// whichever it is), reads the run from the loaded object, compares every
// loaded byte with that state and prints one line per rank:
//   "rank R loaded iteration I bitwise-equal recovered=[...] run=S"
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

StateDict model(int rank, int world, int64_t iteration, int run, bool with_data) {
  StateDict sd = Value::dict();
  at::Tensor w = values(1000 * iteration + rank + 1000003 * run, {64, 128});
  at::Tensor norm = values(iteration + 1000003 * run, {128});
  sd["w"] = ShardedTensor::from_rank_offsets("w", with_data ? w : at::zeros_like(w), {{0, rank, world}});
  sd["norm"] = ShardedTensor::from_rank_offsets("norm", with_data ? norm : at::zeros_like(norm), {}, {rank});
  sd["rng"] = ShardedObject{"rng", fmt::format("rng-{}-{}-{}", rank, iteration, run), {world}, {rank}};
  sd["iteration"] = iteration;
  return sd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"local checkpoint probe"};
  std::string root, action;
  std::string iteration_arg;
  int ranks_per_node = 0, factor = 0, run = 0;
  bool async = false;
  app.add_option("root", root)->required();
  app.add_option("action", action)->required()->check(CLI::IsMember({"save", "load"}));
  app.add_option("iteration", iteration_arg)->required();
  app.add_option("--ranks-per-node", ranks_per_node);
  app.add_option("--factor", factor);
  app.add_flag("--async", async);
  app.add_option("--run", run);
  CLI11_PARSE(app, argc, argv);
  int rank = -1;
  try {
    const int64_t iteration = iteration_arg == "latest" ? -1 : std::stoll(iteration_arg);
    auto comm = communicator_from_env();
    rank = comm->rank();
    LocalCheckpointOptions options;
    if (factor > 0) options.replication = CliqueReplication{ranks_per_node, factor};
    LocalCheckpointManager manager(root, *comm, options);
    if (action == "save") {
      const auto tasd = TensorAwareStateDict::from_state_dict(model(rank, comm->size(), iteration, run, true), *comm,
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
    const int64_t it = manager.last_recovery().iteration;
    const LoadResult r = loaded.to_state_dict(model(rank, comm->size(), it, 0, false), *comm);
    // The run is read from the loaded object; the tensors must be that run's.
    const std::string rng = r.state_dict.at("rng").as_string();
    const std::string prefix = fmt::format("rng-{}-{}-", rank, it);
    const int loaded_run = rng.rfind(prefix, 0) == 0 ? std::stoi(rng.substr(prefix.size())) : -1;
    const StateDict expected = model(rank, comm->size(), it, loaded_run, true);
    const bool equal = (iteration < 0 || it == iteration) && loaded_run >= 0 &&
                       at::equal(r.state_dict.at("w").as_tensor(), expected.at("w").as_sharded_tensor().data) &&
                       at::equal(r.state_dict.at("norm").as_tensor(), expected.at("norm").as_sharded_tensor().data) &&
                       rng == fmt::format("rng-{}-{}-{}", rank, it, loaded_run);
    std::cout << fmt::format("rank {} loaded iteration {} {} recovered=[{}] run={}\n", rank, it,
                             equal ? "bitwise-equal" : "DIFFERENT",
                             fmt::join(manager.last_recovery().recovered_ranks, ","), loaded_run);
    return equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << fmt::format("rank {}: {}: {}\n", rank, error_class_name(error_kind_of(e)), e.what());
    return 1;
  }
}
