#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "distckpt/local/local_checkpoint_manager.h"

namespace distckpt {

void CliqueReplication::validate(int world_size) const {
  if (ranks_per_node < 1 || factor < 1) {
    throw UsageError(fmt::format("CliqueReplication: ranks_per_node ({}) and factor ({}) must be at least 1",
                                 ranks_per_node, factor));
  }
  const int64_t group = int64_t{ranks_per_node} * factor;
  if (world_size % group != 0) {
    throw UsageError(fmt::format(
        "CliqueReplication: a world of {} ranks does not split into groups of factor x ranks_per_node = {} x {} = "
        "{} ranks (whole nodes, {} nodes per group); choose a factor that divides the number of nodes",
        world_size, factor, ranks_per_node, group, factor));
  }
}

std::vector<int> CliqueReplication::clique_of(int rank, int world_size) const {
  validate(world_size);
  const int group = ranks_per_node * factor;
  const int base = rank / group * group + rank % ranks_per_node;
  std::vector<int> clique;
  clique.reserve(static_cast<size_t>(factor));
  for (int i = 0; i < factor; ++i) clique.push_back(base + i * ranks_per_node);
  return clique;
}

}  // namespace distckpt
