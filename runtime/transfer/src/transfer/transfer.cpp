// transfer(): gather every rank's source plan -> the sources as a live
// checkpoint (transfer/live_sources.h) -> a load of the requests through it,
// every piece sent by one of its holders -> the digests compared
// (transfer/digest_check.h).
#include "distckpt/transfer/transfer.h"

#include <fmt/format.h>

#include <memory>
#include <vector>

#include "comm/agreement.h"
#include "core/state_dict_split.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "load/load_from.h"
#include "plan/local_plan.h"
#include "transfer/digest_check.h"
#include "transfer/live_sources.h"

namespace distckpt {
namespace {

// This rank's source tensors (factories applied, kept alive by `split`) and their plan.
std::vector<const ShardedTensor*> source_tensors(const StateDict& sources, SplitStateDict& split,
                                                 plan::LocalPlan& plan) {
  split = split_state_dict(apply_factories(extract_sharded_tensors_and_factories(sources).first));
  std::vector<const ShardedTensor*> mine;
  for (Value* leaf : sharded_leaves(split.sharded)) {
    const ShardedTensor& t = leaf->as_sharded_tensor();
    t.validate_metadata_integrity();
    if (!t.data.defined()) {
      throw UsageError(fmt::format("source '{}' has no data: a transfer sends tensors that hold their values", t.key));
    }
    mine.push_back(&t);
    plan.tensors.push_back(plan::plan_of(t));
  }
  return mine;
}

// KeyMismatchError for a requested tensor that no source holds.
void check_requested_keys(const StateDict& requests, const StorageIndex& sources, int rank) {
  SplitStateDict split = split_state_dict(apply_factories(requests));
  for (Value* leaf : sharded_leaves(split.sharded)) {
    const std::string& key = leaf->as_sharded_tensor().key;
    if (!sources.find_tensor(key)) {
      throw KeyMismatchError(
          fmt::format("rank {} asks for tensor '{}', which no source rank holds (the sources hold {} tensors): every "
                      "requested tensor must be passed by some rank as a source",
                      rank, key, sources.tensors.size()));
    }
  }
}

}  // namespace

TransferResult transfer(const StateDict& sources, const StateDict& requests, Communicator& comm,
                        const TransferOptions& options) {
  SplitStateDict split;
  std::vector<const ShardedTensor*> mine;
  const std::vector<std::string> plans = gather_agreed(comm, "gather the transfer's sources", [&] {
    if (options.bucket_bytes == 0) throw UsageError("TransferOptions::bucket_bytes must be positive");
    if (options.exchange != LoadExchange::kBroadcast && options.exchange != LoadExchange::kAllGather) {
      throw UsageError(fmt::format("TransferOptions::exchange must be broadcast or all_gather, not {}",
                                   load_exchange_name(options.exchange)));
    }
    plan::LocalPlan plan;
    plan.rank = comm.rank();
    mine = source_tensors(sources, split, plan);
    return plan::encode_local_plan(plan);
  });
  // Objects and plain values stay where they are: the result keeps the request's.
  auto [wanted, kept] = extract_sharded_tensors_and_factories(requests);
  std::unique_ptr<transferring::LiveSources> live;
  run_agreed(comm, "plan the transfer's sources", [&] {
    live = std::make_unique<transferring::LiveSources>(plan::decode_local_plans(plans), mine);
    check_requested_keys(wanted, live->index(), comm.rank());
  });

  LoadOptions load;
  load.exchange = options.exchange;
  load.exchange_batch_bytes = options.bucket_bytes;
  load.convert_dtype = options.convert_dtype;
  load.io_threads = options.io_threads;
  const loading::OpenReader open = [&] {
    auto reader = std::make_unique<loading::CheckpointReader>(*live);
    reader->set_chunk_holders([&sources = *live](uint32_t t, uint32_t c) { return sources.holders(t, c); });
    return reader;
  };
  std::vector<loading::FilledTensor> filled;
  LoadResult loaded = loading::load_from(wanted, open, comm, load, options.verify ? &filled : nullptr);

  TransferResult result;
  result.state_dict = std::move(kept);
  merge(result.state_dict, loaded.state_dict);
  result.source_bytes_read = live->bytes_read();
  if (options.verify) {
    transferring::DigestReport report = transferring::compare_digests(
        comm,
        [&] {
          std::vector<transferring::DigestPart> parts = transferring::source_digests(mine);
          std::vector<transferring::DigestPart> received = transferring::received_digests(filled, live->index());
          parts.insert(parts.end(), received.begin(), received.end());
          return parts;
        },
        live->index());
    result.verified = std::move(report.verified);
    result.unverified = std::move(report.unverified);
  }
  return result;
}

}  // namespace distckpt
