// load(): open + verify metadata -> key checks -> plan every requested
// shard's reads (agreed: a missing or incompatible shard fails every rank
// before any transfer) -> read, fully parallel when asked: pieces several
// ranks need are read once and exchanged -> commit_tensor hooks -> merge
// into one state dict.
#include "distckpt/load/load.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/agreement.h"
#include "core/state_dict_split.h"
#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "load/access_integrity.h"
#include "load/checkpoint_reader.h"
#include "load/device_staging.h"
#include "load/load_from.h"
#include "load/load_requests.h"
#include "load/load_result.h"
#include "load/read_engine.h"
#include "load/strict_keys.h"

namespace distckpt {
namespace {

// A request read in its stored dtype for LoadOptions::commit_tensor.
struct PendingCommit {
  Value* leaf;
  ShardedTensor request;
  at::Tensor stored;
};

// The reads of `request` in the stored dtype, when commit_tensor converts it.
std::optional<PendingCommit> plan_read_as_stored(loading::CheckpointReader& reader, Value* leaf,
                                                 const LoadOptions& options, std::vector<loading::TensorRead>& reads) {
  if (!options.commit_tensor) return std::nullopt;
  const ShardedTensor& request = leaf->as_sharded_tensor();
  const TensorRecord& record = reader.tensor(request.key);
  if (record.dtype == request.dtype) return std::nullopt;
  ShardedTensor as_stored = request;
  as_stored.data = at::Tensor();
  as_stored.dtype = record.dtype;
  as_stored.device = at::Device(at::kCPU);  // the hook gets it on the CPU
  at::Tensor stored = loading::plan_tensor_reads(reader, as_stored, reads);
  return PendingCommit{leaf, request, std::move(stored)};
}

void commit(const PendingCommit& c, const LoadOptions& options) {
  at::NoGradGuard no_grad;  // destinations are often parameters
  const ShardedTensor& request = c.request;
  at::Tensor destination =
      request.data.defined() ? request.data : at::empty(c.stored.sizes(), at::TensorOptions().dtype(request.dtype));
  const at::Tensor given = destination;
  options.commit_tensor(request, c.stored, destination);
  if (!destination.is_same(given)) {
    throw UsageError(fmt::format(
        "LoadOptions::commit_tensor replaced the destination of '{}'; fill the given tensor in place ({} of {})",
        request.key, to_string(Shape(c.stored.sizes().begin(), c.stored.sizes().end())), dtype_name(request.dtype)));
  }
  *c.leaf = Value(std::move(destination));
}

}  // namespace

namespace loading {

LoadResult load_from(const StateDict& sharded_state_dict, const OpenReader& open, Communicator& comm,
                     const LoadOptions& options, const LoadHooks& hooks) {
  std::vector<FilledTensor>* const filled = hooks.filled;
  ReadPlanMemo* const memo = hooks.memo;
  std::unique_ptr<loading::CheckpointReader> reader;
  SplitStateDict split;
  loading::KeyMismatch mismatch;
  int io_threads = 0;
  std::optional<loading::DeviceStaging> staging;
  loading::StoredKeys stored;
  // Each collective costs milliseconds when ranks share cores: the key check
  // joins the opening's agreement, and in the *_ALL modes that collective
  // also routes the requested keys' digests to their owners.
  const bool keys_collective = loading::key_check_is_collective(options.strict);
  const auto open_step = [&] {
    io_threads = resolve_io_threads(options.io_threads);  // rejects a negative count before any collective
    if (options.exchange_batch_bytes == 0) throw UsageError("LoadOptions::exchange_batch_bytes must be positive");
    staging.emplace(options.device_staging_bytes);
    reader = open();
    split = split_state_dict(apply_factories(sharded_state_dict));
    for (const Value* leaf : sharded_leaves(split.sharded)) {
      if (leaf->kind() == Kind::kShardedTensor) {
        leaf->as_sharded_tensor().validate_metadata_integrity();
      } else {
        leaf->as_sharded_object().validate_metadata_integrity();
      }
    }
    if (options.strict != StrictHandling::kAssumeOkUnexpected) stored = loading::stored_keys_of(*reader);
    if (!keys_collective) mismatch = loading::handle_key_mismatch(split.sharded, stored, comm, options.strict);
  };
  // A memo is replayed only where nothing else is collective to check: this
  // rank opens and plans alone, and a failure joins the reads' first
  // agreement instead. (Elsewhere the load plans afresh and refills it.)
  const bool replay = memo && memo->valid && !keys_collective && !options.validate_access_integrity;
  if (hooks.check && !replay)
    throw UsageError("internal: a check on the reads' first agreement needs a memo to replay");
  std::exception_ptr early;
  if (replay) {
    try {
      open_step();
    } catch (...) {
      early = std::current_exception();
    }
  }
  const std::vector<std::string> routed_keys =
      replay
          ? std::vector<std::string>{}
          : loading::agreed_routing_keys(comm, "open the checkpoint", options.strict, open_step, split.sharded, stored);
  if (keys_collective) {
    // Every rank reaches the owners' answers; a raise on one rank is then agreed on by all.
    std::exception_ptr key_error;
    try {
      mismatch = loading::handle_key_mismatch(split.sharded, stored, comm, options.strict, routed_keys);
    } catch (...) {
      key_error = std::current_exception();
    }
    agree_on_errors(comm, "check keys against the checkpoint", key_error);
  }
  if (options.validate_access_integrity) loading::validate_access_integrity(split.sharded, comm);

  std::vector<std::vector<loading::TensorRead>> rounds;
  // Requests without data for a device other than the CPU: read on the CPU
  // and moved once complete, unless they are CUDA ones read as they are
  // requested (made on their device and read into through staging).
  std::vector<std::pair<Value*, at::Device>> moves;
  std::vector<PendingCommit> commits;
  std::vector<std::pair<ShardedTensor, Value*>> requested;  // for `filled`
  const loading::ReadEngineOptions engine{options.exchange, io_threads, options.exchange_batch_bytes};
  // One collective agrees on planning and carries what the read engine shares.
  const std::function<const std::vector<std::vector<loading::TensorRead>>&()> plan_reads =
      [&]() -> const std::vector<std::vector<loading::TensorRead>>& {
    std::vector<loading::TensorRead> reads;
    for (Value* leaf : sharded_leaves(split.sharded)) {
      if (leaf->kind() != Kind::kShardedTensor) {
        *leaf = loading::load_object(*reader, leaf->as_sharded_object());
        continue;
      }
      const ShardedTensor& request = leaf->as_sharded_tensor();
      if (filled) requested.emplace_back(request.without_data(), leaf);
      const bool elsewhere = !request.data.defined() && !request.device.is_cpu();
      if (std::optional<PendingCommit> c = plan_read_as_stored(*reader, leaf, options, reads)) {
        if (elsewhere) moves.emplace_back(leaf, request.device);  // the hook fills a CPU tensor
        commits.push_back(std::move(*c));
        continue;
      }
      if (elsewhere && !request.device.is_cuda()) moves.emplace_back(leaf, request.device);
      *leaf = Value(loading::plan_tensor_reads(*reader, request, reads, options.convert_dtype));
    }
    rounds = staging->plan_rounds(std::move(reads));
    return rounds;
  };
  std::vector<std::string> read_plans;
  if (replay) {  // the ranks' needs are what they were: this rank's reads are planned again (their destinations)
    if (!early) {
      try {
        plan_reads();
      } catch (...) {
        early = std::current_exception();
      }
    }
    read_plans = memo->read_plans;
  } else {
    read_plans = loading::agree_on_read_plans(comm, "plan the reads", engine, plan_reads);
  }
  std::vector<std::string> decisions = replay ? memo->decisions : std::vector<std::string>{};
  if (hooks.reads_began) *hooks.reads_began = std::chrono::steady_clock::now();
  // A replaying rank whose reader never opened joins the reads' first agreement without reading.
  std::exception_ptr read_error;
  if (reader) {
    read_error =
        loading::execute_reads(*reader, rounds, comm, engine, read_plans, *staging, &decisions, early, hooks.check);
  } else if (hooks.check) {
    loading::join_first_read_agreement(comm, *hooks.check, early);  // raises the agreed error, as every rank does
  } else {
    read_error = loading::fail_reads(comm, engine, early);
  }
  if (hooks.check && !hooks.check->held) return LoadResult{};  // alike on every rank: nothing was read

  // One agreed step for the reads' outcome and the rest.
  Value common;
  run_agreed(comm,
             "read the tensors and finish the load (commit converted tensors, move tensors to their devices, "
             "read the common state)",
             [&] {
               if (read_error) std::rethrow_exception(read_error);
               for (const PendingCommit& c : commits) commit(c, options);
               for (auto& [leaf, device] : moves) *leaf = Value(leaf->as_tensor().to(device));
               common = reader->read_common_state();
             });
  if (filled) {
    for (auto& [request, leaf] : requested) filled->push_back(FilledTensor{std::move(request), leaf->as_tensor()});
  }
  if (memo && !replay) *memo = ReadPlanMemo{true, std::move(read_plans), std::move(decisions)};
  LoadResult result =
      loading::assemble_load_result(std::move(common), split, sharded_state_dict, std::move(mismatch), options.strict);
  result.bytes_read = reader->bytes_read();
  return result;
}

}  // namespace loading

LoadResult load(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
                const LoadOptions& options) {
  const loading::OpenReader open = [&] {
    // Only the coordinator checks every data file up front (its failure is
    // agreed on); the others check the files they read as they open them.
    std::unique_ptr<StorageReader> storage =
        open_storage(dir, StorageOptions{options.format, options.verify_checksums, comm.rank() == 0});
    if (options.mapping) storage = map_storage(std::move(storage), *options.mapping);
    return std::make_unique<loading::CheckpointReader>(std::move(storage));
  };
  return loading::load_from(sharded_state_dict, open, comm, options);
}

LoadResult load(const StateDict& sharded_state_dict, StorageReader& storage, Communicator& comm,
                const LoadOptions& options) {
  const loading::OpenReader open = [&] { return std::make_unique<loading::CheckpointReader>(storage); };
  return loading::load_from(sharded_state_dict, open, comm, options);
}

}  // namespace distckpt
