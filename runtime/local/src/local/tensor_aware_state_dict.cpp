#include "distckpt/local/tensor_aware_state_dict.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <optional>

#include "comm/agreement.h"
#include "core/state_dict_split.h"
#include "distckpt/core/errors.h"
#include "format/local_state_codec.h"
#include "io/checksum.h"
#include "load/access_integrity.h"
#include "load/load_result.h"
#include "load/strict_keys.h"
#include "local/messages.h"
#include "local/shard_exchange.h"
#include "plan/local_plan.h"
#include "plan/partitioned_plan.h"
#include "save/partitioned_writers.h"

namespace distckpt {
namespace {

// Fully parallel: which of this rank's tensors it keeps, decided as save()
// decides writers, by partitioned planning (save/partitioned_writers.h): the
// global sharding validated and each replicated shard given to one of its
// holders, balanced within each set of holders, in four agreed all-to-alls
// in which no rank holds every rank's plan. With a parallelization group
// only its members take part: they hold part of the sharding, so only dtype
// and shape agreement can be checked.
std::vector<bool> distribute(plan::LocalPlan local, Communicator& comm, bool whole_world) {
  local.rank = comm.rank();
  // Replica ids are global: a group may hold no main replica of a shard its
  // members replicate. Within a group every holder is a candidate keeper.
  if (!whole_world) {
    for (plan::ShardPlan& s : local.tensors) s.replica_id = ReplicaId(std::vector<int64_t>(s.replica_id.size(), 0));
  }
  saving::BalancedShare b = saving::balance_writers(
      comm, "route the shard plans", [] {}, local, WriterPolicy::kBalanced, /*check_access=*/whole_world);
  const std::vector<std::string> decisions = all_to_all_agreed(comm, "choose the keepers", [&] {
    return plan::decide_share(b.share, b.choices, comm.size(), /*coordinator=*/-1);
  });
  std::vector<bool> kept(local.tensors.size(), false);
  for (const uint32_t item : plan::assignment_from_decisions(decisions, local)) {
    if (item < kept.size()) kept[item] = true;
  }
  // Empty shards are never assigned a writer; there is nothing to exchange.
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = kept[i] || local.tensors[i].stored_numel() == 0;
  return kept;
}

uint64_t digest(const std::vector<uint64_t>& hashes) {
  return hashes.empty() ? 0 : io::xxh3(hashes.data(), hashes.size() * sizeof(uint64_t));
}

// nullopt: every rank's cache holds the distribution of exactly these
// structures (decided from gathered values, so identically on every rank).
std::optional<std::vector<bool>> kept_shards(const plan::LocalPlan& local, Communicator& comm, bool whole_world,
                                             const std::vector<uint64_t>* cached_hashes,
                                             std::vector<uint64_t>* hashes_out) {
  const std::vector<std::string> gathered = comm.all_gather_bytes(
      local::encode_structure_announcement({plan::structure_hash(local), cached_hashes ? digest(*cached_hashes) : 0}));
  std::vector<uint64_t> hashes, cached;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const auto a = local::decode_structure_announcement(gathered[r], fmt::format("rank {}", r));
    hashes.push_back(a.structure_hash);
    cached.push_back(a.cached_distribution);
  }
  *hashes_out = hashes;
  const uint64_t now = digest(hashes);
  bool reuse = true;
  for (uint64_t c : cached) reuse = reuse && c == now;
  if (reuse) return std::nullopt;
  return distribute(local, comm, whole_world);
}

// to_state_dict, the steps.

void check_loadable(const LocalState& state, Communicator& comm, const ToStateDictOptions& options) {
  if (options.exchange_batch_bytes == 0) throw UsageError("ToStateDictOptions::exchange_batch_bytes must be positive");
  if (state.world_size != comm.size() || state.owner_rank != comm.rank()) {
    throw UsageError(fmt::format(
        "this tensor-aware state dict belongs to rank {} of {} but is loaded on rank {} of {}; local checkpoints "
        "load under the layout they were saved with — use the global checkpoint to change it",
        state.owner_rank, state.world_size, comm.rank(), comm.size()));
  }
}

loading::StoredKeys stored_keys(const LocalState& state, int rank) {
  loading::StoredKeys stored;
  stored.where = fmt::format("the local checkpoint of rank {}", rank);
  stored.per_rank = true;
  for (const LocalTensorEntry& e : state.tensors) stored.tensors.insert(e.meta.key);
  for (const ShardedObject& o : state.objects) stored.add_object(o.key, o.unique_key());
  return stored;
}

// Strict handling, with the outcome agreed by every rank; `routed`: the
// *_ALL modes' key digests (loading::route_key_digests) routed here.
loading::KeyMismatch agreed_key_check(SplitStateDict& split, const loading::StoredKeys& stored, Communicator& comm,
                                      StrictHandling strict, const std::vector<std::string>& routed) {
  loading::KeyMismatch mismatch;
  std::exception_ptr key_error;
  try {
    mismatch = loading::handle_key_mismatch(split.sharded, stored, comm, strict, routed);
  } catch (...) {
    key_error = std::current_exception();
  }
  agree_on_errors(comm, "check keys against the local checkpoint", key_error);
  return mismatch;
}

// What the request needs: the shards this rank keeps (offered to others)
// and those it must receive, with the leaves they fill.
struct ShardRequests {
  std::vector<local::KeptShard> kept;
  std::vector<local::NeededShard> needed;
  std::vector<Value*> needed_leaves;
};

void resolve_object(Value& leaf, const std::map<std::string, const ShardedObject*>& objects, const std::string& where) {
  const auto it = objects.find(leaf.as_sharded_object().unique_key());
  if (it == objects.end()) {
    throw KeyMismatchError(
        fmt::format("sharded object '{}' is not in {}", leaf.as_sharded_object().unique_key(), where));
  }
  leaf = Value(it->second->data);
}

// The stored entry matching a requested shard; ShardingError when the layout differs.
const LocalTensorEntry& matching_entry(const ShardedTensor& want, const LocalState& state,
                                       const std::map<std::string, size_t>& by_identity, const std::string& where,
                                       size_t& index) {
  const auto it = by_identity.find(local::shard_identity(want));
  if (it == by_identity.end()) {
    throw ShardingError(
        fmt::format("{} is not in {}: local checkpoints load only under the layout they were "
                    "saved with (same keys, shard positions and flat ranges)",
                    want.describe(), where));
  }
  index = it->second;
  const ShardedTensor& have = state.tensors[index].meta;
  if (have.dtype != want.dtype || have.local_shape != want.local_shape || have.global_shape != want.global_shape) {
    throw ShardingError(
        fmt::format("{} does not match the stored shard {}: local checkpoints load only under "
                    "the layout they were saved with",
                    want.describe(), have.describe()));
  }
  return state.tensors[index];
}

ShardRequests match_requests(const LocalState& state, const std::vector<at::Tensor>& tensors, SplitStateDict& split,
                             const std::string& where, const at::Device& wire_device) {
  ShardRequests out;
  std::map<std::string, size_t> by_identity;
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    const std::string id = local::shard_identity(state.tensors[i].meta);
    by_identity.emplace(id, i);
    if (tensors[i].defined()) out.kept.push_back(local::KeptShard{id, tensors[i]});
  }
  std::map<std::string, const ShardedObject*> objects;
  for (const ShardedObject& o : state.objects) objects.emplace(o.unique_key(), &o);
  for (Value* leaf : sharded_leaves(split.sharded)) {
    if (leaf->kind() == Kind::kShardedObject) {
      resolve_object(*leaf, objects, where);
      continue;
    }
    const ShardedTensor& want = leaf->as_sharded_tensor();
    size_t index = 0;
    const LocalTensorEntry& entry = matching_entry(want, state, by_identity, where, index);
    const at::Tensor& stored_data = tensors[index];
    if (stored_data.defined()) {
      // Into the caller's tensor when it brings one; else the stored tensor itself.
      *leaf = want.data.defined() ? Value(want.data.copy_(stored_data)) : Value(stored_data);
      continue;
    }
    const Shape shape = want.flattened_range ? Shape{want.flattened_range->size()} : want.local_shape;
    at::Tensor dest =
        want.data.defined() ? want.data : at::empty(shape, at::TensorOptions().dtype(want.dtype).device(wire_device));
    out.needed.push_back(local::NeededShard{local::shard_identity(entry.meta), want.describe(), dest});
    out.needed_leaves.push_back(leaf);
  }
  return out;
}

}  // namespace

TensorAwareAlgo parse_tensor_aware_algo(const std::string& name) {
  if (name == "atomic") return TensorAwareAlgo::kAtomic;
  if (name == "fully_parallel") return TensorAwareAlgo::kFullyParallel;
  throw UsageError(fmt::format("unknown tensor-aware algorithm '{}' (use 'atomic' or 'fully_parallel')", name));
}

const char* tensor_aware_algo_name(TensorAwareAlgo algo) {
  return algo == TensorAwareAlgo::kAtomic ? "atomic" : "fully_parallel";
}

TensorAwareStateDict::TensorAwareStateDict(LocalState state, std::vector<at::Tensor> tensors)
    : state_(std::move(state)), tensors_(std::move(tensors)) {
  hollow_ = tensors_.empty() && !state_.tensors.empty();
  if (hollow_) tensors_.resize(state_.tensors.size());
  if (tensors_.size() != state_.tensors.size()) {
    throw UsageError(
        fmt::format("TensorAwareStateDict: {} tensors for {} records", tensors_.size(), state_.tensors.size()));
  }
}

TensorAwareStateDict TensorAwareStateDict::from_state_dict(const StateDict& sharded_state_dict, Communicator& comm,
                                                           TensorAwareAlgo algo,
                                                           const std::shared_ptr<ShardDistributionCache>& cache,
                                                           Communicator* parallelization_group) {
  Communicator& group = parallelization_group ? *parallelization_group : comm;
  TensorAwareStateDict out;
  plan::LocalPlan local;
  run_agreed(comm, "build the tensor-aware state dict", [&] {
    SplitStateDict split = split_state_dict(apply_factories(sharded_state_dict));
    out.state_.owner_rank = comm.rank();
    out.state_.world_size = comm.size();
    out.state_.algorithm = tensor_aware_algo_name(algo);
    out.state_.common = std::move(split.common);
    local.rank = comm.rank();
    for (Value* leaf : sharded_leaves(split.sharded)) {
      if (leaf->kind() == Kind::kShardedObject) {
        const ShardedObject& o = leaf->as_sharded_object();
        o.validate_metadata_integrity();
        out.state_.objects.push_back(o);
        continue;
      }
      const ShardedTensor& t = leaf->as_sharded_tensor();
      t.validate_metadata_integrity();
      if (!t.data.defined()) {
        throw UsageError(fmt::format("tensor-aware state dicts need the data of every tensor; '{}' has none", t.key));
      }
      LocalTensorEntry e;
      e.meta = t.without_data();
      e.device = t.data.device().str();
      out.state_.tensors.push_back(std::move(e));
      out.tensors_.push_back(t.data);
      local.tensors.push_back(plan::plan_of(t));
    }
  });
  // Decided on comm's size (the same everywhere), not the group's: groups may
  // differ in size, and every rank must reach the same agreed steps.
  if (algo == TensorAwareAlgo::kFullyParallel && comm.size() > 1) {
    std::vector<bool> kept;
    std::vector<uint64_t> hashes;
    run_agreed(comm, "distribute the replicated shards", [&] {
      if (group.size() == 1) {  // nobody to share with: keep everything
        kept.assign(local.tensors.size(), true);
        return;
      }
      std::optional<std::vector<bool>> fresh =
          kept_shards(local, group, &group == &comm, cache ? &cache->hashes_ : nullptr, &hashes);
      if (!fresh) {
        kept = cache->kept_;
        ++cache->reused_;
        return;
      }
      kept = std::move(*fresh);
      if (cache) {
        cache->hashes_ = hashes;
        cache->kept_ = kept;
        ++cache->computed_;
      }
    });
    for (size_t i = 0; i < kept.size(); ++i) {
      out.state_.tensors[i].held = kept[i];
      if (!kept[i]) out.tensors_[i] = at::Tensor();
    }
  }
  return out;
}

TensorAwareAlgo TensorAwareStateDict::algorithm() const { return parse_tensor_aware_algo(state_.algorithm); }

void TensorAwareStateDict::check_not_hollow(const char* what) const {
  if (hollow_)
    throw UsageError(
        fmt::format("TensorAwareStateDict::{}: the dict is hollow; insert_tensors() or init_tensors() first", what));
}

std::vector<at::Tensor> TensorAwareStateDict::pop_tensors() {
  check_not_hollow("pop_tensors");
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (state_.tensors[i].held) out.push_back(std::move(tensors_[i]));
    tensors_[i] = at::Tensor();
  }
  hollow_ = true;
  return out;
}

void TensorAwareStateDict::insert_tensors(std::vector<at::Tensor> tensors) {
  if (!hollow_) throw UsageError("TensorAwareStateDict::insert_tensors: the dict already holds its tensors");
  size_t next = 0;
  for (size_t i = 0; i < state_.tensors.size(); ++i) {
    if (!state_.tensors[i].held) continue;
    const ShardedTensor& meta = state_.tensors[i].meta;
    if (next >= tensors.size()) {
      throw UsageError(
          fmt::format("TensorAwareStateDict::insert_tensors: {} tensors given, more are kept", tensors.size()));
    }
    const at::Tensor& t = tensors[next];
    const Shape expected = meta.flattened_range ? Shape{meta.flattened_range->size()} : meta.local_shape;
    if (!t.defined() || t.scalar_type() != meta.dtype || Shape(t.sizes().begin(), t.sizes().end()) != expected) {
      throw UsageError(
          fmt::format("TensorAwareStateDict::insert_tensors: tensor {} does not match '{}' (expected {} {})", next,
                      meta.key, to_string(expected), c10::toString(meta.dtype)));
    }
    tensors_[i] = std::move(tensors[next++]);
  }
  if (next != tensors.size()) {
    throw UsageError(
        fmt::format("TensorAwareStateDict::insert_tensors: {} tensors given, {} are kept", tensors.size(), next));
  }
  hollow_ = false;
}

void TensorAwareStateDict::init_tensors() {
  if (!hollow_) return;
  for (size_t i = 0; i < state_.tensors.size(); ++i) {
    if (!state_.tensors[i].held) continue;
    const ShardedTensor& meta = state_.tensors[i].meta;
    const Shape shape = meta.flattened_range ? Shape{meta.flattened_range->size()} : meta.local_shape;
    at::Device device(at::kCPU);
    try {
      device = at::Device(state_.tensors[i].device);
    } catch (const std::exception&) {
      device = at::Device(at::kCPU);
    }
    if (device.is_cuda() && !at::hasCUDA()) device = at::Device(at::kCPU);
    tensors_[i] = at::empty(shape, at::TensorOptions().dtype(meta.dtype).device(device));
  }
  hollow_ = false;
}

void TensorAwareStateDict::copy_tensors_to_cpu(bool non_blocking) {
  check_not_hollow("copy_tensors_to_cpu");
  const bool pin = at::hasCUDA();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    at::Tensor& t = tensors_[i];
    if (!t.defined()) continue;
    state_.tensors[i].device = t.device().str();
    if (t.device().is_cpu()) continue;
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(pin));
    host.copy_(t, non_blocking);
    t = host;
  }
}

void TensorAwareStateDict::restore_tensor_device(bool non_blocking) {
  check_not_hollow("restore_tensor_device");
  for (size_t i = 0; i < tensors_.size(); ++i) {
    at::Tensor& t = tensors_[i];
    if (!t.defined() || t.device().str() == state_.tensors[i].device) continue;
    t = t.to(at::Device(state_.tensors[i].device), non_blocking);
  }
}

uint64_t TensorAwareStateDict::kept_bytes() const {
  uint64_t bytes = 0;
  for (const LocalTensorEntry& e : state_.tensors) {
    if (e.held) bytes += static_cast<uint64_t>(e.meta.held_numel()) * c10::elementSize(e.meta.dtype);
  }
  return bytes;
}

std::string TensorAwareStateDict::serialize_hollow() const { return encode_local_state(state_); }

TensorAwareStateDict TensorAwareStateDict::deserialize_hollow(std::string_view bytes, const std::string& origin) {
  return TensorAwareStateDict(decode_local_state(bytes, origin));
}

LoadResult TensorAwareStateDict::to_state_dict(const StateDict& sharded_state_dict, Communicator& comm,
                                               const ToStateDictOptions& options) const {
  SplitStateDict split;
  loading::StoredKeys stored;
  TensorAwareAlgo algo = TensorAwareAlgo::kAtomic;
  const auto prepare = [&] {
    algo = options.algo.value_or(algorithm());
    check_not_hollow("to_state_dict");
    check_loadable(state_, comm, options);
    split = split_state_dict(apply_factories(sharded_state_dict));
    stored = stored_keys(state_, comm.rank());
  };
  const std::vector<std::string> routed = loading::agreed_routing_keys(
      comm, "prepare the tensor-aware state dict for loading", options.strict, prepare, split.sharded, stored);
  loading::KeyMismatch mismatch = agreed_key_check(split, stored, comm, options.strict, routed);
  if (options.validate_access_integrity) loading::validate_access_integrity(split.sharded, comm);
  ShardRequests requests;
  run_agreed(comm, "match the requested shards",
             [&] { requests = match_requests(state_, tensors_, split, stored.where, comm.tensor_device()); });
  if (algo == TensorAwareAlgo::kAtomic) {
    run_agreed(comm, "check that every requested shard was kept here", [&] {
      if (!requests.needed.empty()) {
        throw ShardingError(
            fmt::format("to_state_dict with the atomic algorithm: this rank did not keep {} (kept by "
                        "another rank: load with the fully_parallel algorithm)",
                        requests.needed.front().description));
      }
    });
  } else {
    Communicator& group = options.parallelization_group ? *options.parallelization_group : comm;
    run_agreed(comm, "exchange the shards kept by other ranks", [&] {
      local::exchange_kept_shards(requests.kept, requests.needed, group, options.exchange,
                                  options.exchange_batch_bytes);
    });
  }
  for (size_t i = 0; i < requests.needed.size(); ++i) *requests.needed_leaves[i] = Value(requests.needed[i].dest);
  return loading::assemble_load_result(state_.common, split, sharded_state_dict, std::move(mismatch), options.strict);
}

}  // namespace distckpt
