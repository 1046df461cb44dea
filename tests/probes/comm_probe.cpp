// distckpt_comm_probe OUT_DIR [FAILING_RANK]: one rank of a job started by
// distckpt-launch, for the e2e tests. It connects with communicator_from_env,
// all-gathers the ranks, broadcasts from the last rank and agrees on a step
// (which throws on FAILING_RANK, if given), then writes what it saw to
// OUT_DIR/rank_<R>.txt.
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "comm/agreement.h"
#include "distckpt/comm/process_group.h"
#include "distckpt/core/errors.h"

namespace {

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (const std::string& part : parts) text += (text.empty() ? "" : ",") + part;
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::cerr << "usage: distckpt_comm_probe OUT_DIR [FAILING_RANK]\n";
    return 2;
  }
  const std::string out_dir = argv[1];
  const int failing_rank = argc == 3 ? std::atoi(argv[2]) : -1;
  int rank = -1;
  try {
    distckpt::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(60);
    auto comm = distckpt::communicator_from_env(options);
    rank = comm->rank();
    const std::vector<std::string> ranks = comm->all_gather_bytes(std::to_string(rank));
    const std::string greeting = comm->broadcast_bytes("hello from " + std::to_string(rank), comm->size() - 1);
    std::string agreement = "ok";
    try {
      distckpt::run_agreed(*comm, "probe step", [&] {
        if (rank == failing_rank) throw distckpt::ShardingError("probe failure");
      });
    } catch (const std::exception& e) {
      agreement = e.what();
    }
    std::ofstream(out_dir + "/rank_" + std::to_string(rank) + ".txt")
        << "size=" << comm->size() << " ranks=" << join(ranks) << " greeting=" << greeting << " agreement=" << agreement
        << "\n";
    // Every report is on disk before any rank exits (and the launcher, on a
    // non-zero exit, stops the rest).
    comm->barrier();
    return agreement == "ok" ? 0 : 3;
  } catch (const std::exception& e) {
    std::cerr << "distckpt_comm_probe (rank " << rank << "): " << e.what() << "\n";
    return 1;
  }
}
