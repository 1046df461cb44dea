// distckpt_fault_probe: one rank of a job started by distckpt-launch, for the
// e2e tests of I/O faults and hung ranks (faults are injected from outside,
// by strace, a preloaded library or a full file system).
//   distckpt_fault_probe DIR save SEED [--mb N]   save (overwrite) a state made from SEED
//   distckpt_fault_probe DIR async-save SEED ...   the same as an asynchronous save with
//                                                  background staging, then finalized
//   distckpt_fault_probe DIR load SEED [--mb N]   load it and compare every byte
//   distckpt_fault_probe DIR transfer SEED ...     transfer "w" so that each rank gets the
//                                                  next rank's rows, no storage (DIR unused)
//   distckpt_fault_probe DIR host-transfer SEED    the same within one host: ranks read the
//                                                  next rank's rows out of its memory
// --io-threads N sets SaveOptions/LoadOptions::io_threads (default: automatic).
// Prints "rank R saved seed S" or "rank R loaded/transferred seed S bitwise-equal"
// (host-transfer adds ", D of B bytes read directly") and exits 0; on an error, prints "rank R failed: CLASS: WHAT"
// (CLASS: the distckpt error class, e.g. IoError), then for an error the ranks agreed on one line per failed rank,
// "rank R report: rank F CLASS errno=E PATH", and exits 1.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "distckpt/distckpt.h"
#include "probes/fault_state.h"

using namespace distckpt;

int main(int argc, char** argv) {
  CLI::App app{"I/O fault probe"};
  std::string dir, action;
  int64_t seed = 0, mb = 4;
  app.add_option("dir", dir)->required();
  app.add_option("action", action)
      ->required()
      ->check(CLI::IsMember({"save", "async-save", "load", "transfer", "host-transfer"}));
  app.add_option("seed", seed)->required();
  app.add_option("--mb", mb, "MiB of tensor data in all");
  int io_threads = 0;
  app.add_option("--io-threads", io_threads, "I/O threads per rank (0: automatic)");
  CLI11_PARSE(app, argc, argv);
  // The launcher's RANK until the communicator is made (it may never be).
  const char* launcher_rank = std::getenv("RANK");
  int rank = launcher_rank != nullptr ? std::atoi(launcher_rank) : -1;
  try {
    auto comm = communicator_from_env();
    rank = comm->rank();
    if (action == "save" || action == "async-save") {
      SaveOptions options;
      options.overwrite = true;
      options.io_threads = io_threads;
      if (action == "save") {
        save(fault_state(rank, comm->size(), seed, mb, true), dir, *comm, options);
      } else {
        AsyncQueueOptions queue_options;
        queue_options.staging = AsyncStaging::kInBackground;
        AsyncCallsQueue queue(*comm, queue_options);
        queue.save(fault_state(rank, comm->size(), seed, mb, true), dir, options);
        queue.wait_staged();
        queue.close();  // finalizes: a failure on any rank is raised here, on every rank
      }
      std::cout << fmt::format("rank {} saved seed {}\n", rank, seed);
      return 0;
    }
    if (action == "transfer" || action == "host-transfer") {
      // Each rank asks for the next rank's rows: all of "w" travels.
      const int world = comm->size(), next = (rank + 1) % world;
      StateDict requests = Value::dict();
      requests["w"] = fault_state(next, world, seed, mb, false).at("w");
      TransferOptions options;
      if (action == "transfer") {
        options.bucket_bytes = uint64_t{1} << 13;     // many messages: a kill lands inside the transfer
        options.exchange = LoadExchange::kBroadcast;  // messages, as between hosts (not shared memory)
      } else {
        options.bucket_bytes = uint64_t{1} << 16;  // many reads: a fault lands inside the transfer
        options.exchange = LoadExchange::kAuto;    // direct reads where the host allows, else shared memory
      }
      const TransferResult r = transfer(fault_state(rank, world, seed, mb, true), requests, *comm, options);
      const at::Tensor got = r.state_dict.at("w").as_tensor();
      const bool equal = at::equal(got, fault_state(next, world, seed, mb, true).at("w").as_sharded_tensor().data);
      const std::string direct = action == "transfer"
                                     ? ""
                                     : fmt::format(", {} of {} bytes read directly", r.bytes_read_directly,
                                                   static_cast<uint64_t>(got.numel()) * got.element_size());
      std::cout << fmt::format("rank {} transferred seed {} {}{}\n", rank, seed, equal ? "bitwise-equal" : "DIFFERENT",
                               direct);
      return equal ? 0 : 1;
    }
    LoadOptions load_options;
    load_options.io_threads = io_threads;
    const LoadResult r = load(fault_state(rank, comm->size(), seed, mb, false), dir, *comm, load_options);
    const StateDict expected = fault_state(rank, comm->size(), seed, mb, true);
    const bool equal = at::equal(r.state_dict.at("w").as_tensor(), expected.at("w").as_sharded_tensor().data) &&
                       at::equal(r.state_dict.at("bias").as_tensor(), expected.at("bias").as_sharded_tensor().data);
    std::cout << fmt::format("rank {} loaded seed {} {}\n", rank, seed, equal ? "bitwise-equal" : "DIFFERENT");
    return equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::cout << fmt::format("rank {} failed: {}: {}\n", rank, error_class_name(error_kind_of(e)), e.what());
    if (const auto* agreed = dynamic_cast<const Error*>(&e)) {
      for (const RankFailure& f : agreed->failures()) {
        std::cout << fmt::format("rank {} report: rank {} {} errno={} {}\n", rank, f.rank, error_class_name(f.kind),
                                 f.error_number, f.path);
      }
    }
    std::cout << std::flush;
    return 1;
  }
}
