// Common state compared across ranks: leaf hashes, the differing paths, the warning or refusal.
#include "save/common_check.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "comm/agreement.h"
#include "core/quoted_list.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "io/checksum.h"

namespace distckpt::saving {
namespace {

uint64_t hash_leaf(const Value& leaf) {
  io::StreamingHash h;
  const auto kind = static_cast<uint8_t>(leaf.kind());
  h.update(&kind, 1);
  switch (leaf.kind()) {
    case Kind::kBool: {
      const uint8_t v = leaf.as_bool();
      h.update(&v, 1);
      break;
    }
    case Kind::kInt: {
      const int64_t v = leaf.as_int();
      h.update(&v, sizeof v);
      break;
    }
    case Kind::kFloat: {
      const double v = leaf.as_float();
      h.update(&v, sizeof v);
      break;
    }
    case Kind::kString:
      h.update(leaf.as_string().data(), leaf.as_string().size());
      break;
    case Kind::kTensor: {
      const at::Tensor& original = leaf.as_tensor();
      if (!original.defined() || original.is_sparse()) break;  // rank 0's encoder names these; hash the kind only
      const at::Tensor t = original.detach().resolve_conj().resolve_neg().to(at::kCPU).contiguous();
      const auto dtype = static_cast<int8_t>(t.scalar_type());
      h.update(&dtype, 1);
      h.update(t.sizes().data(), t.sizes().size() * sizeof(int64_t));
      h.update(t.data_ptr(), t.nbytes());
      break;
    }
    default:
      break;  // None; sharded entries never reach the common state
  }
  return h.digest();
}

}  // namespace

plan::CommonLeafHashes hash_common_leaves(const Value& common) {
  plan::CommonLeafHashes out;
  for (const auto& [path, leaf] : nested_items(common)) {
    out.paths.push_back(to_string(path));
    out.hashes.push_back(hash_leaf(*leaf));
  }
  return out;
}

std::vector<std::string> differing_paths(const plan::CommonLeafHashes& mine,
                                         const plan::CommonLeafHashes& coordinator) {
  // By path, not by order: joined path strings do not sort as the tree walks.
  std::unordered_map<std::string_view, uint64_t> theirs;
  theirs.reserve(coordinator.paths.size());
  for (size_t i = 0; i < coordinator.paths.size(); ++i) theirs.emplace(coordinator.paths[i], coordinator.hashes[i]);
  std::vector<std::string> out;
  std::unordered_set<std::string_view> seen;
  for (size_t i = 0; i < mine.paths.size(); ++i) {
    seen.insert(mine.paths[i]);
    const auto it = theirs.find(mine.paths[i]);
    if (it == theirs.end() || it->second != mine.hashes[i]) out.push_back(mine.paths[i]);
  }
  for (const std::string& path : coordinator.paths) {
    if (!seen.count(path)) out.push_back(path);
  }
  return out;
}

void check_common_state(const plan::CommonLeafHashes& mine, const std::vector<uint64_t>& digests, CommonStateCheck mode,
                        int coordinator, Communicator& comm) {
  const bool is_coordinator = comm.rank() == coordinator;
  const std::string coordinator_bytes =
      comm.broadcast_bytes(is_coordinator ? plan::encode_common_leaf_hashes(mine) : std::string(), coordinator);
  const std::string theirs = fmt::format("rank {}", coordinator);
  run_agreed(comm, fmt::format("compare the common state with {}'s", theirs), [&] {
    if (digests[static_cast<size_t>(comm.rank())] == digests[static_cast<size_t>(coordinator)]) return;
    const std::vector<std::string> paths =
        differing_paths(mine, plan::decode_common_leaf_hashes(coordinator_bytes, theirs));
    const std::string message =
        fmt::format("the common (non-sharded) state of rank {} differs from {}'s at {}; only {}'s is saved",
                    comm.rank(), theirs, quoted_list(paths), theirs);
    if (mode == CommonStateCheck::kError) {
      throw CheckpointError(message +
                            " (SaveOptions::common_state_check is kError): make the values agree, or "
                            "shard them (ShardedObject) if each rank's matters");
    }
    log_message(LogLevel::kWarning, message);
  });
}

}  // namespace distckpt::saving
