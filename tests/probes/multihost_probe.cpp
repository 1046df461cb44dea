// distckpt_multihost_probe: one rank of a job spread over simulated hosts
// (tests/e2e/netns_hosts.sh), for tests/e2e/multihost_test.cpp.
//   distckpt_multihost_probe save DIR [--gate G]            global save; with --gate an async save
//                                                           that waits for G/go before it finalizes
//   distckpt_multihost_probe load DIR [--exchange X] [--resave DIR2]
//   distckpt_multihost_probe local-save ROOT ITER [--hold G]  after saving, barriers until one fails
//   distckpt_multihost_probe local-load ROOT ITER
//   distckpt_multihost_probe transfer - [--exchange X]     transfer(): each rank gets the next rank's
//                                                           rows of a tensor of 1 MiB per rank, no storage
// Options for all: --timeout-ms T (collective timeout), --ranks-per-node J and
// --factor F (local replication, default 2 and 2).
// Every state is a deterministic function of (rank, world, iteration); loads
// compare each byte with it. Lines start with "rank R host H", H being the
// host name the load exchange compares.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "distckpt/distckpt.h"

namespace {

using namespace distckpt;

at::Tensor values(int64_t seed, at::IntArrayRef shape) {
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return at::rand(shape, gen);
}

// "emb" (512 KiB) is replicated on every rank: stored once, needed whole by
// all, so the load exchange decides who reads it. "w" is split by rank.
StateDict global_model(int rank, int world, bool with_data) {
  StateDict sd = Value::dict();
  const at::Tensor emb = values(7, {256, 512});
  const at::Tensor w = values(100 + rank, {64, 256});
  sd["emb"] = ShardedTensor::from_rank_offsets("emb", with_data ? emb : at::zeros_like(emb), {}, {rank});
  sd["w"] = ShardedTensor::from_rank_offsets("w", with_data ? w : at::zeros_like(w), {{0, rank, world}});
  sd["step"] = int64_t{42};
  return sd;
}

StateDict local_model(int rank, int world, int64_t iteration, bool with_data) {
  StateDict sd = Value::dict();
  const at::Tensor w = values(1000 * iteration + rank, {64, 128});
  const at::Tensor norm = values(iteration, {128});
  sd["w"] = ShardedTensor::from_rank_offsets("w", with_data ? w : at::zeros_like(w), {{0, rank, world}});
  sd["norm"] = ShardedTensor::from_rank_offsets("norm", with_data ? norm : at::zeros_like(norm), {}, {rank});
  sd["rng"] = ShardedObject{"rng", fmt::format("rng-{}-{}", rank, iteration), {world}, {rank}};
  sd["iteration"] = iteration;
  return sd;
}

bool same_tensor(const StateDict& loaded, const StateDict& expected, const std::string& key) {
  return at::equal(loaded.at(key).as_tensor(), expected.at(key).as_sharded_tensor().data);
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

void touch(const std::string& path) { std::ofstream(path) << "\n"; }

// The test's signal to go on; bounded so a lost test cannot leave us waiting.
void wait_for_file(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::ifstream(path).good()) {
    if (std::chrono::steady_clock::now() > deadline) throw Error("gave up waiting for " + path);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct Args {
  std::string action, dir, gate, hold, resave, exchange = "auto";
  int64_t iteration = 0;
  int ranks_per_node = 2, factor = 2;
  int64_t timeout_ms = 0;
};

int run(const Args& a, Communicator& comm, const std::string& who) {
  const int rank = comm.rank();
  const int world = comm.size();
  if (a.action == "transfer") {
    // 1 MiB rows per rank, so that what crosses a link stands out from the job's own traffic.
    const auto rows = [&](int of, bool with_data) {
      const at::Tensor t = values(200 + of, {1024, 256});
      return ShardedTensor::from_rank_offsets("w", with_data ? t : at::zeros_like(t), {{0, of, world}});
    };
    const int next = (rank + 1) % world;
    StateDict sources = Value::dict(), requests = Value::dict();
    sources["w"] = rows(rank, true);
    requests["w"] = rows(next, false);
    TransferOptions options;
    options.exchange = parse_load_exchange(a.exchange);
    const TransferResult r = transfer(sources, requests, comm, options);
    const at::Tensor got = r.state_dict.at("w").as_tensor();
    const bool equal = at::equal(got, rows(next, true).data);
    std::cout << fmt::format("{} transferred {} of {} bytes read directly {}\n", who, r.bytes_read_directly,
                             static_cast<uint64_t>(got.numel()) * got.element_size(), equal ? "equal" : "DIFFERENT");
    return equal ? 0 : 1;
  }
  if (a.action == "save") {
    if (a.gate.empty()) {
      save(global_model(rank, world, true), a.dir, comm);
    } else {
      AsyncCallsQueue queue(comm);
      queue.save(global_model(rank, world, true), a.dir);
      touch(fmt::format("{}/started.rank{}", a.gate, rank));
      wait_for_file(a.gate + "/go");
      queue.close();
    }
    std::cout << fmt::format("{} saved\n", who);
    return 0;
  }
  if (a.action == "load") {
    LoadOptions options;
    options.exchange = parse_load_exchange(a.exchange);
    const LoadResult r = load(global_model(rank, world, false), a.dir, comm, options);
    const StateDict expected = global_model(rank, world, true);
    const bool equal = same_tensor(r.state_dict, expected, "emb") && same_tensor(r.state_dict, expected, "w") &&
                       r.state_dict.at("step").as_int() == 42;
    std::cout << fmt::format("{} bytes_read {} {}\n", who, r.bytes_read, equal ? "equal" : "DIFFERENT");
    if (!a.resave.empty()) {
      // What was loaded, saved again: its digest must be the original's.
      StateDict again = global_model(rank, world, false);
      again["emb"].as_sharded_tensor().data = r.state_dict.at("emb").as_tensor();
      again["w"].as_sharded_tensor().data = r.state_dict.at("w").as_tensor();
      again["step"] = r.state_dict.at("step").as_int();
      save(again, a.resave, comm);
    }
    return equal ? 0 : 1;
  }
  LocalCheckpointOptions options;
  options.replication = CliqueReplication{a.ranks_per_node, a.factor};
  LocalCheckpointManager manager(a.dir, comm, options);
  if (a.action == "local-save") {
    manager.save(TensorAwareStateDict::from_state_dict(local_model(rank, world, a.iteration, true), comm,
                                                       TensorAwareAlgo::kFullyParallel),
                 a.iteration);
    std::cout << fmt::format("{} saved iteration {}\n", who, a.iteration) << std::flush;
    if (a.hold.empty()) return 0;
    // Stay in the job, as training would, until a peer is gone.
    touch(fmt::format("{}/saved.rank{}", a.hold, rank));
    for (;;) {
      comm.barrier();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  const TensorAwareStateDict loaded = manager.load();
  const LoadResult r = loaded.to_state_dict(local_model(rank, world, a.iteration, false), comm);
  const StateDict expected = local_model(rank, world, a.iteration, true);
  const bool equal = manager.last_recovery().iteration == a.iteration && same_tensor(r.state_dict, expected, "w") &&
                     same_tensor(r.state_dict, expected, "norm") &&
                     r.state_dict.at("rng").as_string() == fmt::format("rng-{}-{}", rank, a.iteration);
  std::cout << fmt::format("{} loaded iteration {} {} recovered=[{}]\n", who, manager.last_recovery().iteration,
                           equal ? "bitwise-equal" : "DIFFERENT",
                           fmt::join(manager.last_recovery().recovered_ranks, ","));
  return equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"multi-host probe"};
  Args a;
  app.add_option("action", a.action)
      ->required()
      ->check(CLI::IsMember({"save", "load", "local-save", "local-load", "transfer"}));
  app.add_option("dir", a.dir)->required();
  app.add_option("iteration", a.iteration);
  app.add_option("--gate", a.gate);
  app.add_option("--hold", a.hold);
  app.add_option("--resave", a.resave);
  app.add_option("--exchange", a.exchange);
  app.add_option("--ranks-per-node", a.ranks_per_node);
  app.add_option("--factor", a.factor);
  app.add_option("--timeout-ms", a.timeout_ms, "collective timeout (0: the default)");
  CLI11_PARSE(app, argc, argv);
  std::string who = fmt::format("rank ? host {}", host_name());
  try {
    ProcessGroupOptions pg;
    if (a.timeout_ms > 0) pg.timeout = std::chrono::milliseconds(a.timeout_ms);
    const auto comm = communicator_from_env(pg);
    who = fmt::format("rank {} host {}", comm->rank(), host_name());
    return run(a, *comm, who);
  } catch (const std::exception& e) {
    std::cerr << fmt::format("{} failed: {}\n", who, e.what());
    return 1;
  }
}
