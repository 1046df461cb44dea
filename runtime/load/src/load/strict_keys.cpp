#include "load/strict_keys.h"

#include <fmt/format.h>

#include "core/quoted_list.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "plan/messages.h"

namespace distckpt::loading {
namespace {

// The key a leaf is reported under: objects by key, not by shard.
const std::string& report_key(const Value& leaf) {
  return leaf.kind() == Kind::kShardedTensor ? leaf.as_sharded_tensor().key : leaf.as_sharded_object().key;
}

std::set<std::string> global_requested_keys(const std::set<std::string>& local, Communicator& comm) {
  std::set<std::string> all;
  const std::vector<std::string> gathered = comm.all_gather_bytes(plan::encode_requested_keys(local));
  for (size_t r = 0; r < gathered.size(); ++r) {
    for (std::string& k : plan::decode_requested_keys(gathered[r], fmt::format("rank {}", r))) all.insert(std::move(k));
  }
  return all;
}

}  // namespace

bool key_check_is_collective(StrictHandling mode) {
  return mode == StrictHandling::kLogAll || mode == StrictHandling::kRaiseAll || mode == StrictHandling::kReturnAll;
}

KeyMismatch handle_key_mismatch(Value& sharded, const CheckpointReader& reader, Communicator& comm,
                                StrictHandling mode) {
  if (mode == StrictHandling::kAssumeOkUnexpected) return {};
  StoredKeys stored;
  stored.where = fmt::format("the checkpoint '{}'", reader.dir());
  for (const TensorRecord& t : reader.index().tensors) stored.tensors.insert(t.key);
  for (const ObjectRecord& o : reader.index().objects) stored.add_object(o.key, o.unique_key());
  return handle_key_mismatch(sharded, stored, comm, mode);
}

KeyMismatch handle_key_mismatch(Value& sharded, const StoredKeys& stored, Communicator& comm, StrictHandling mode) {
  KeyMismatch found;
  if (mode == StrictHandling::kAssumeOkUnexpected) return found;
  auto is_stored = [&](const Value& leaf) {
    return leaf.kind() == Kind::kShardedTensor ? stored.tensors.count(leaf.as_sharded_tensor().key) > 0
                                               : stored.object_shards.count(leaf.as_sharded_object().unique_key()) > 0;
  };
  std::set<std::string> requested;
  bool skip = false;
  for (const Value* leaf : nested_values(sharded)) {
    requested.insert(report_key(*leaf));
    if (!is_stored(*leaf)) {
      found.unexpected.insert(report_key(*leaf));
      skip = true;
    }
  }
  if (key_check_is_collective(mode)) {
    const std::set<std::string> everywhere = global_requested_keys(requested, comm);
    for (const auto* keys : {&stored.tensors, &stored.object_keys}) {
      for (const std::string& k : *keys) {
        if (!everywhere.count(k)) found.missing.insert(k);
      }
    }
  }

  const std::string unexpected_msg = found.unexpected.empty()
                                         ? ""
                                         : fmt::format("unexpected keys (requested on rank {} but not in {}): {}",
                                                       comm.rank(), stored.where, quoted_list(found.unexpected));
  const std::string missing_msg =
      found.missing.empty()
          ? ""
          : fmt::format("missing keys (in {} but requested by no rank): {}", stored.where, quoted_list(found.missing));
  switch (mode) {
    case StrictHandling::kRaiseAll:
      if (!found.missing.empty() || !found.unexpected.empty()) {
        throw KeyMismatchError(unexpected_msg + (unexpected_msg.empty() || missing_msg.empty() ? "" : "; ") +
                               missing_msg);
      }
      break;
    case StrictHandling::kRaiseUnexpected:
      if (!found.unexpected.empty()) throw KeyMismatchError(unexpected_msg);
      break;
    case StrictHandling::kLogAll:
      if (!missing_msg.empty()) log_message(LogLevel::kWarning, missing_msg);
      [[fallthrough]];
    case StrictHandling::kLogUnexpected:
      if (!unexpected_msg.empty()) log_message(LogLevel::kWarning, unexpected_msg);
      break;
    default:
      break;
  }
  if (skip) sharded = extract_matching(sharded, is_stored).first;
  return found;
}

}  // namespace distckpt::loading
