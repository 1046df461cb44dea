// transfer(): gather every rank's source plan -> the sources as a live
// checkpoint (transfer/live_sources.h) -> a load of the requests through it,
// every piece sent by one of its holders -> the digests compared
// (transfer/digest_check.h). With a plan cache, the first two steps and the
// load's planning collectives run once while nothing changes.
#include "distckpt/transfer/transfer.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "comm/agreement.h"
#include "core/state_dict_split.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "io/checksum.h"
#include "load/load_from.h"
#include "plan/local_plan.h"
#include "transfer/digest_check.h"
#include "transfer/external_names.h"
#include "transfer/live_sources.h"
#include "transfer/peer_memory.h"

namespace distckpt {

struct TransferPlanCache::State {
  uint64_t planned_for = 0;  // the hash of every rank's structure, as planned
  uint64_t structure = 0;    // this rank's, as planned
  std::shared_ptr<const transferring::SourceLayout> layout;
  loading::ReadPlanMemo reads;
  uint64_t made = 0, reused = 0;
  bool valid() const { return layout != nullptr && reads.valid; }
};

struct TransferPlanCacheAccess {
  using State = TransferPlanCache::State;
  static State& state(TransferPlanCache& cache) { return *cache.state_; }
};

TransferPlanCache::TransferPlanCache() : state_(std::make_unique<State>()) {}
TransferPlanCache::~TransferPlanCache() = default;
std::shared_ptr<TransferPlanCache> TransferPlanCache::create() {
  return std::shared_ptr<TransferPlanCache>(new TransferPlanCache());
}
uint64_t TransferPlanCache::plans_made() const { return state_->made; }
uint64_t TransferPlanCache::plans_reused() const { return state_->reused; }
void TransferPlanCache::invalidate() {
  const uint64_t made = state_->made, reused = state_->reused;
  *state_ = State{};
  state_->made = made;
  state_->reused = reused;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

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

// This rank's requests (factories applied) as a plan, and the devices they land on.
struct Requested {
  plan::LocalPlan plan;
  std::string devices;
};
Requested requested_of(const StateDict& requests) {
  SplitStateDict split = split_state_dict(apply_factories(requests));
  Requested out;
  for (Value* leaf : sharded_leaves(split.sharded)) {
    const ShardedTensor& t = leaf->as_sharded_tensor();
    out.plan.tensors.push_back(plan::plan_of(t));
    out.devices += (t.data.defined() ? t.data.device() : t.device).str() + ";";
  }
  return out;
}

// The storages of the tensors the caller passed (factories' too): they keep
// their place from one transfer to the next, unlike what a factory builds.
std::vector<const void*> owned_storages(const StateDict& sources) {
  std::vector<const void*> out;
  for (const Value* leaf : nested_values(sources)) {
    const at::Tensor* data = leaf->kind() == Kind::kShardedTensor ? &leaf->as_sharded_tensor().data
                             : leaf->kind() == Kind::kFactory     ? &leaf->as_factory().data
                                                                  : nullptr;
    if (data && data->defined()) out.push_back(data->storage().data());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What a rank's part of a plan depends on: its place in the world, its
// sources (and where they lie, when it offers them), its requests
// (structure and devices) and the options that shape the plan.
uint64_t structure_of(const plan::LocalPlan& sources, const transferring::Reach& reach, const Requested& requested,
                      const TransferOptions& options, int world) {
  const std::string options_text =
      fmt::format("rank {} of {}: {} {} {} {} {}", sources.rank, world, options.bucket_bytes,
                  load_exchange_name(options.exchange), options.convert_dtype, options.direct_reads, requested.devices);
  uint64_t h = plan::structure_hash(sources);
  h = h * 0x9e3779b97f4a7c15ull ^ io::xxh3(reach.addresses.data(), reach.addresses.size() * sizeof(uint64_t));
  h = h * 0x9e3779b97f4a7c15ull ^ plan::structure_hash(requested.plan);
  return h * 0x9e3779b97f4a7c15ull ^ std::hash<std::string>{}(options_text);
}

// KeyMismatchError for a requested tensor that no source holds.
void check_requested_keys(const plan::LocalPlan& requested, const StorageIndex& sources, int rank) {
  for (const plan::ShardPlan& s : requested.tensors) {
    if (!sources.find_tensor(s.key)) {
      throw KeyMismatchError(
          fmt::format("rank {} asks for tensor '{}', which no source rank holds (the sources hold {} tensors): every "
                      "requested tensor must be passed by some rank as a source",
                      rank, s.key, sources.tensors.size()));
    }
  }
}

uint64_t hash_of(const std::vector<uint64_t>& structures) {
  return io::xxh3(structures.data(), structures.size() * sizeof(uint64_t)) | 1;  // never 0: "no plan"
}

std::string u64_bytes(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); }

// The 8 bytes `bytes` begins with (what rank `rank` sent as `what`).
uint64_t u64_of(const std::string& bytes, const std::string& what, size_t rank) {
  if (bytes.size() < sizeof(uint64_t)) {
    throw ProtocolError(
        fmt::format("rank {} sent a {}-byte {} (expected {} or more)", rank, bytes.size(), what, sizeof(uint64_t)));
  }
  uint64_t v = 0;
  std::memcpy(&v, bytes.data(), sizeof v);
  return v;
}

// The check every rank's cached plan meets, carried by the reads' first
// agreement: each rank sends what its plan was made for (the hash of every
// rank's structure then; 0 when it has none, or its own structure changed
// since), and the plan holds when every rank sent the same non-zero hash:
// then no rank's structure changed, and all replay the same plan.
loading::FirstAgreementCheck plan_check(uint64_t planned_for) {
  loading::FirstAgreementCheck check;
  check.phase = "check the cached transfer plan and begin the reads";
  check.mine = u64_bytes(planned_for);
  check.holds = [](const std::vector<std::string>& all) {
    const uint64_t first = u64_of(all.at(0), "transfer plan check", 0);
    bool same = first != 0;
    for (size_t r = 0; r < all.size(); ++r) same = u64_of(all[r], "transfer plan check", r) == first && same;
    return same;
  };
  return check;
}

// Every rank's sources gathered, checked and laid out alike on every rank,
// each rank's requests checked against them; where ranks of a host can read
// one another's memory, they become holders of what that host offers.
// `structures` receives every rank's structure.
std::shared_ptr<const transferring::SourceLayout> plan_sources(Communicator& comm, const plan::LocalPlan& source_plan,
                                                               const transferring::Reach& reach,
                                                               const plan::LocalPlan& requested, uint64_t structure,
                                                               std::vector<uint64_t>& structures) {
  const std::vector<std::string> gathered = gather_agreed(comm, "gather the transfer's sources", [&] {
    return u64_bytes(structure) + transferring::encode_source(plan::encode_local_plan(source_plan), reach);
  });
  std::vector<plan::LocalPlan> plans;
  std::vector<transferring::Reach> reaches(gathered.size());
  std::shared_ptr<transferring::SourceLayout> layout;
  const std::vector<std::string> readable = gather_agreed(comm, "plan the transfer's sources", [&] {
    std::vector<std::string> plan_bytes(gathered.size());
    structures.assign(gathered.size(), 0);
    for (size_t r = 0; r < gathered.size(); ++r) {
      structures[r] = u64_of(gathered[r], "transfer source", r);
      std::tie(plan_bytes[r], reaches[r]) = transferring::decode_source(
          std::string_view(gathered[r]).substr(sizeof(uint64_t)), fmt::format("rank {}", r));
    }
    plans = plan::decode_local_plans(plan_bytes);
    for (size_t r = 0; r < plans.size(); ++r) {
      if (!reaches[r].addresses.empty() && reaches[r].addresses.size() != plans[r].tensors.size()) {
        throw ProtocolError(fmt::format("rank {} offered {} source addresses for {} sources", r,
                                        reaches[r].addresses.size(), plans[r].tensors.size()));
      }
    }
    layout = std::make_shared<transferring::SourceLayout>(plans);
    check_requested_keys(requested, layout->index, comm.rank());
    // The ranks of a host read one another's memory only where each of them can.
    return std::string(reach.pid != 0 && transferring::can_read_host_peers(reaches, comm.rank()) ? "1" : "0");
  });
  std::vector<bool> can_read(readable.size());
  for (size_t r = 0; r < readable.size(); ++r) can_read[r] = readable[r] == "1";
  layout->add_direct_readers(plans, reaches, transferring::direct_groups(reaches, can_read));
  return layout;
}

// This rank's part of a transfer, once described.
struct Described {
  SplitStateDict split;  // keeps the source tensors alive
  std::vector<const ShardedTensor*> mine;
  plan::LocalPlan source_plan;
  transferring::Reach reach;
  StateDict wanted, kept;  // the requested tensors; the rest of the request (objects, plain values) stays
  Requested requested;
  uint64_t structure = 0;
};

// Fills `d` in place: its tensors point into its own split.
void describe(const StateDict& sources, const StateDict& requests, const TransferOptions& options, bool direct,
              int rank, int world, Described& d) {
  d.source_plan.rank = rank;
  std::tie(d.wanted, d.kept) = extract_sharded_tensors_and_factories(requests);
  if (options.mapping) d.wanted = transferring::in_source_names(d.wanted, *options.mapping);
  if (options.bucket_bytes == 0) throw UsageError("TransferOptions::bucket_bytes must be positive");
  if (options.exchange == LoadExchange::kNone) {
    throw UsageError("TransferOptions::exchange cannot be none: a rank can read only the sources it holds");
  }
  d.mine = source_tensors(sources, d.split, d.source_plan);
  if (direct) d.reach = transferring::reach_of(d.mine, owned_storages(sources));
  d.requested = requested_of(d.wanted);
  d.structure = structure_of(d.source_plan, d.reach, d.requested, options, world);
}

// The bytes moved by a load of the requests out of the sources laid out as
// `layout`, then the digests compared; with `check`, the load stops (an
// empty result, check->held false) where the cached plan does not hold.
TransferResult move(const Described& d, const std::shared_ptr<const transferring::SourceLayout>& layout,
                    Communicator& comm, const TransferOptions& options, loading::ReadPlanMemo* memo,
                    loading::FirstAgreementCheck* check, Clock::time_point& reads_began) {
  transferring::LiveSources live(layout, d.mine, comm.rank());
  LoadOptions load;
  load.exchange = options.exchange;
  load.exchange_batch_bytes = options.bucket_bytes;
  load.convert_dtype = options.convert_dtype;
  load.io_threads = options.io_threads;
  const loading::OpenReader open = [&] {
    auto reader = std::make_unique<loading::CheckpointReader>(live);
    reader->set_chunk_holders([&live](uint32_t t, uint32_t c) { return live.holders(t, c); });
    return reader;
  };
  std::vector<loading::FilledTensor> filled;
  loading::LoadHooks hooks;
  hooks.filled = options.verify ? &filled : nullptr;
  hooks.memo = memo;
  hooks.reads_began = &reads_began;
  hooks.check = check;
  LoadResult loaded = loading::load_from(d.wanted, open, comm, load, hooks);
  TransferResult result;
  if (check && !check->held) return result;
  const Clock::time_point moved = Clock::now();
  result.state_dict = d.kept;
  merge(result.state_dict, loaded.state_dict);
  result.source_bytes_read = live.bytes_read();
  result.bytes_read_directly = live.bytes_read_directly();
  if (options.verify) {
    transferring::DigestReport report = transferring::compare_digests(
        comm,
        [&] {
          std::vector<transferring::DigestPart> parts = transferring::source_digests(d.mine);
          std::vector<transferring::DigestPart> received = transferring::received_digests(filled, layout->index);
          parts.insert(parts.end(), received.begin(), received.end());
          return parts;
        },
        layout->index);
    result.verified = std::move(report.verified);
    result.unverified = std::move(report.unverified);
  }
  result.moving_seconds = seconds(reads_began, moved);
  result.verifying_seconds = seconds(moved, Clock::now());
  return result;
}

TransferResult run_transfer(const StateDict& sources, const StateDict& requests, Communicator& comm,
                            const TransferOptions& options, TransferPlanCacheAccess::State* cache) {
  const Clock::time_point start = Clock::now();
  // Within a host, ranks read the sources of the others straight out of their memory (peer_memory.h).
  const bool direct = options.direct_reads && options.exchange == LoadExchange::kAuto && comm.size() > 1;
  const transferring::PeerReadsAllowed allowed(direct);
  Described d;
  std::exception_ptr failed;  // joins the first agreement, which fails on every rank
  try {
    describe(sources, requests, options, direct, comm.rank(), comm.size(), d);
  } catch (...) {
    failed = std::current_exception();
  }
  // A rank whose cache holds a plan of its structure replays it; the reads' first agreement checks every rank's
  // (no collective of its own), and where any rank lacks one, every rank plans anew.
  const bool replaying = !failed && cache && cache->valid() && cache->structure == d.structure;
  loading::FirstAgreementCheck check = plan_check(replaying ? cache->planned_for : 0);
  Clock::time_point reads_began = start;
  TransferResult result;
  if (replaying) {
    result = move(d, cache->layout, comm, options, &cache->reads, &check, reads_began);
  } else {
    loading::join_first_read_agreement(comm, check, failed);
  }
  const bool reused = check.held;
  if (!reused) {
    std::vector<uint64_t> structures;
    const std::shared_ptr<const transferring::SourceLayout> layout =
        plan_sources(comm, d.source_plan, d.reach, d.requested.plan, d.structure, structures);
    loading::ReadPlanMemo fresh;
    result = move(d, layout, comm, options, cache ? &fresh : nullptr, nullptr, reads_began);
    if (cache) {
      cache->planned_for = hash_of(structures);
      cache->structure = d.structure;
      cache->layout = layout;
      cache->reads = std::move(fresh);
      ++cache->made;
    }
  } else {
    ++cache->reused;
  }
  result.plan_reused = reused;
  result.planning_seconds = seconds(start, reads_began);
  return result;
}

}  // namespace

TransferResult transfer(const StateDict& sources, const StateDict& requests, Communicator& comm,
                        const TransferOptions& options) {
  TransferPlanCacheAccess::State* cache =
      options.plan_cache ? &TransferPlanCacheAccess::state(*options.plan_cache) : nullptr;
  try {
    return run_transfer(sources, requests, comm, options, cache);
  } catch (...) {
    if (cache) options.plan_cache->invalidate();  // a failed transfer leaves no plan half made or half trusted
    throw;
  }
}

}  // namespace distckpt
