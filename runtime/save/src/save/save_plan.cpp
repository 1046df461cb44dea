#include "save/save_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string>
#include <system_error>
#include <vector>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"
#include "distckpt/storage/format_registry.h"
#include "format/common_state.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "plan/local_plan.h"
#include "plan/messages.h"
#include "plan/partitioned_plan.h"
#include "save/common_check.h"
#include "save/partitioned_writers.h"
#include "storage/object_commit.h"

namespace distckpt {

uint64_t SavePlanCache::State::digest() const {
  if (valid) return saving::plan_digest(hashes);
  if (seed && !seed->header().plan_hashes.empty()) return saving::plan_digest(seed->header().plan_hashes);
  return 0;
}

namespace saving {
namespace {

// The structure hash of a rank, also covering what else decides the plan
// (a cached plan's metadata skeleton lives on its coordinator only).
uint64_t rank_hash(const plan::LocalPlan& local, WriterPolicy policy, int world_size, int coordinator) {
  const uint64_t parts[4] = {plan::structure_hash(local), static_cast<uint64_t>(policy),
                             static_cast<uint64_t>(world_size), static_cast<uint64_t>(coordinator)};
  return io::xxh3(parts, sizeof parts);
}

at::ScalarType stored_dtype_of(const SaveTransform& transform, const ShardedTensor& t) {
  const at::ScalarType dtype = transform.stored_dtype(t);
  if (!is_storable_dtype(dtype)) {
    throw UsageError(
        fmt::format("SaveOptions::transform.stored_dtype gave {} for '{}', which a checkpoint cannot store",
                    c10::toString(dtype), t.key));
  }
  return dtype;
}

// Split, validate every leaf, build this rank's plan, snapshot common state.
plan::LocalPlan describe_local(PreparedSave& p, const StateDict& state_dict, bool coordinator) {
  p.split = split_state_dict(apply_factories(state_dict));
  plan::LocalPlan local;
  local.rank = p.rank;
  for (Value* leaf : sharded_leaves(p.split.sharded)) {
    if (leaf->kind() == Kind::kShardedTensor) {
      const ShardedTensor& t = leaf->as_sharded_tensor();
      t.validate_metadata_integrity();
      p.tensors.push_back(&t);
      local.tensors.push_back(plan::plan_of(t));
      if (p.options.transform.stored_dtype) local.tensors.back().dtype = stored_dtype_of(p.options.transform, t);
      p.stored_dtypes.push_back(local.tensors.back().dtype);
    } else {
      const ShardedObject& o = leaf->as_sharded_object();
      o.validate_metadata_integrity();
      p.objects.push_back(&o);
      local.objects.push_back(plan::plan_of(o));
    }
  }
  const std::optional<StateDict>& content = p.options.content_metadata;
  if (content && !content->is_dict()) {
    throw UsageError(fmt::format("SaveOptions::content_metadata must be a dict, not a {}", kind_name(content->kind())));
  }
  if (coordinator) p.distckpt_save.common_state = encode_common_state(p.split.common, content);
  return local;
}

// Partitioned planning (save/partitioned_writers.h): four all-to-alls, each
// carrying its step's errors, so no rank ever holds every rank's plan.
void plan_from_scratch(PreparedSave& p, const plan::LocalPlan& local, Communicator& comm) {
  const int world = comm.size();
  BalancedShare b = balance_writers(
      comm, "route the save plan", [] {}, local, p.options.writers, p.options.validate_access_integrity);
  const std::vector<std::string> decisions = all_to_all_agreed(
      comm, "choose the writers", [&] { return plan::decide_share(b.share, b.choices, world, p.coordinator); });
  run_agreed(comm, "assemble the save plan", [&] {
    p.assignment = plan::assignment_from_decisions(decisions, local);
    if (p.is_coordinator()) {
      p.global = std::make_shared<plan::GlobalSavePlan>(plan::global_plan_from_decisions(decisions, world));
    }
  });
}

// The cached plan; seeded from a checkpoint, it is first recovered from that
// checkpoint's metadata (which can fail, so that step is agreed).
void plan_from_cache(PreparedSave& p, const plan::LocalPlan& local, SavePlanCacheAccess::State& cache,
                     Communicator& comm) {
  if (cache.valid) {
    p.assignment = cache.assignment;
    p.global = cache.global;
    return;
  }
  run_agreed(comm, "recover the save plan recorded in the checkpoint", [&] {
    const storage::DistckptStorage& seed = *cache.seed;
    p.assignment = plan::local_assignment_from_metadata(
        seed.header(),
        [&](const std::string& key) -> const TensorRecord* {
          const std::optional<size_t> i = seed.find_tensor(key);
          return i ? &seed.tensor_at(*i) : nullptr;
        },
        [&](uint32_t file) { return seed.file_at(file).writer_rank; }, local, p.rank);
    if (p.is_coordinator()) {
      p.global = std::make_shared<plan::GlobalSavePlan>(plan::global_plan_from_metadata(seed.metadata()));
    }
  });
}

io::FileWriteOptions file_write_options(const SaveOptions& options) {
  io::FileWriteOptions o;
  o.threads = resolve_io_threads(options.io_threads);
  o.direct_io = options.direct_io;
  o.checksum_block = options.checksum_block_size;
  return o;
}

// What the distckpt writer records and how its rank writes (set on every
// rank, whichever writer the save uses: it is cheap).
void describe_for_writer(PreparedSave& p) {
  storage::DistckptSave& d = p.distckpt_save;
  d.rank = p.rank;
  d.world_size = p.world_size;
  d.overwrite = p.options.overwrite;
  d.file_options = file_write_options(p.options);
  d.checksum_block_size = p.options.checksum_block_size;
  d.layout_name = p.options.layout_name;
  d.layout_fingerprint = p.options.layout_fingerprint;
  d.layout_schema = p.options.layout_schema;
  d.name_mappings = p.options.name_mappings;
  d.writer_policy = writer_policy_name(p.options.writers);
}

// The writer of SaveOptions::format: distckpt's own (its metadata is this
// plan), or the registered format's.
std::unique_ptr<StorageWriter> make_writer(PreparedSave& p) {
  const StorageFormat& format = p.options.format;
  if (format.is_detected() || format == StorageFormat::distckpt()) {
    auto writer = std::make_unique<storage::DistckptWriter>(p.target, p.distckpt_save);
    p.distckpt = writer.get();
    return writer;
  }
  if (p.options.content_metadata) {
    throw UsageError(fmt::format(
        "SaveOptions::content_metadata is stored with distckpt's common state; a {} save has no place for it "
        "(save in the distckpt format, or leave it empty)",
        format.name()));
  }
  return find_format(format.name()).make_writer(p.target, format);
}

// The options a rank can check alone; returns the coordinator.
int checked_options(const SaveOptions& options, const Communicator& comm) {
  if (options.checksum_block_size == 0) throw UsageError("SaveOptions::checksum_block_size must be positive");
  if (options.checksum_block_size > StorageIndex::kMaxChecksumBlockSize) {
    throw UsageError(
        fmt::format("SaveOptions::checksum_block_size is {} bytes; at most {} (1 GiB), since a reader holds "
                    "a block in memory to check it",
                    options.checksum_block_size, StorageIndex::kMaxChecksumBlockSize));
  }
  resolve_io_threads(options.io_threads);  // rejects a negative count
  if (options.coordinator_rank < 0 || options.coordinator_rank >= comm.size()) {
    throw UsageError(fmt::format("SaveOptions::coordinator_rank is {}, but the ranks are 0 to {}",
                                 options.coordinator_rank, comm.size() - 1));
  }
  return options.coordinator_rank;
}

// Run on every rank with the same announcements, so all of them throw or none.
void check_same_coordinator(const std::vector<int32_t>& coordinators) {
  for (size_t r = 1; r < coordinators.size(); ++r) {
    if (coordinators[r] != coordinators[0]) {
      throw UsageError(
          fmt::format("SaveOptions::coordinator_rank is {} on rank 0 but {} on rank {}; pass the same on "
                      "every rank",
                      coordinators[0], coordinators[r], r));
    }
  }
}

// Every rank's SaveOptions::coordinator_rank, by rank.
std::vector<int32_t> gather_coordinators(Communicator& comm, int coordinator) {
  std::vector<int32_t> out;
  for (const std::string& text : comm.all_gather_bytes(std::to_string(coordinator))) {
    int32_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) {
      throw ProtocolError(fmt::format("rank {} sent '{}' as its coordinator rank", out.size(), text));
    }
    out.push_back(value);
  }
  return out;
}

SaveContents contents_of(const plan::GlobalSavePlan& global, const StateDict& common) {
  SaveContents contents;
  contents.tensors.reserve(global.skeleton.tensors.size());
  for (const TensorRecord& t : global.skeleton.tensors) contents.tensors.push_back({t.key, t.dtype, t.global_shape});
  for (const ObjectRecord& o : global.skeleton.objects) contents.objects.push_back(o.unique_key());
  contents.common = &common;
  return contents;
}

}  // namespace

StorageIndex dry_run(const StateDict& state_dict, Communicator& comm, const SaveOptions& options) {
  PreparedSave p;
  p.options = options;
  p.rank = comm.rank();
  p.world_size = comm.size();
  // Planned as save() plans (plan_from_scratch): no rank holds every rank's plan.
  plan::LocalPlan local;
  const auto describe = [&] {
    if (!options.format.is_detected() && options.format != StorageFormat::distckpt()) {
      throw UsageError(
          fmt::format("dry_run_save describes saves in the distckpt format, not {}", options.format.name()));
    }
    p.coordinator = checked_options(options, comm);
    local = describe_local(p, state_dict, /*coordinator=*/false);
  };
  BalancedShare b = balance_writers(comm, "describe the state dict", describe, local, options.writers,
                                    options.validate_access_integrity);
  // Every rank gets every planner's records and builds the index itself.
  const std::vector<std::string> records = gather_agreed(comm, "choose the writers", [&] {
    plan::apply_writer_choices(b.share, b.choices);
    return plan::encode_plan_decision({{}, plan::planned_records(b.share.plans, b.share.grouping, b.share.writer)});
  });
  StorageIndex index;
  run_agreed(comm, "assemble the index",
             [&] { index = std::move(plan::global_plan_from_decisions(records, comm.size()).skeleton); });
  return index;
}

uint64_t plan_digest(const std::vector<uint64_t>& hashes) {
  return hashes.empty() ? 0 : io::xxh3(hashes.data(), hashes.size() * sizeof(uint64_t)) | 1;  // never 0
}

std::unique_ptr<PreparedSave> prepare_save(const StateDict& state_dict, const std::string& dir, Communicator& comm,
                                           const SaveOptions& options, StorageWriter* writer) {
  auto p = std::make_unique<PreparedSave>();
  p->writer = writer;
  p->options = options;
  p->rank = comm.rank();
  p->world_size = comm.size();
  plan::LocalPlan local;
  plan::CommonLeafHashes common_hashes;
  SavePlanCacheAccess::State* cache = options.plan_cache ? &SavePlanCacheAccess::state(*options.plan_cache) : nullptr;
  // One collective carries every rank's checks, its structure hash and what
  // its cache holds; the coordinator prepares the staging directory in the
  // same step. Every rank sees every announcement, so every rank takes the
  // same decision about reuse.
  std::vector<std::string> announced;
  try {
    announced = gather_agreed(comm, "prepare the state dict for saving", [&] {
      p->coordinator = checked_options(options, comm);
      p->target = dir;
      describe_for_writer(*p);
      if (!p->writer) p->writer = (p->owned_writer = make_writer(*p)).get();
      local = describe_local(*p, state_dict, p->is_coordinator());
      common_hashes = hash_common_leaves(p->split.common);
      // A seed whose objects were written by other replicas (an older planner) is planned again.
      const bool seed_fits = !cache || cache->valid || !cache->seed ||
                             plan::objects_written_by_main_replicas(
                                 cache->seed->header(),
                                 [&](uint32_t file) { return cache->seed->file_at(file).writer_rank; }, local, p->rank);
      const plan::PlanAnnouncement mine{rank_hash(local, options.writers, comm.size(), p->coordinator),
                                        cache && seed_fits ? cache->digest() : 0, common_hashes.digest(),
                                        p->coordinator, p->is_coordinator() ? storage::new_save_id() : 0};
      if (p->is_coordinator()) {
        p->claimed = true;
        p->writer->claim();
      }
      return plan::encode_plan_announcement(mine);
    });
  } catch (const Error& e) {
    if (p->claimed) p->writer->discard();
    // Ranks naming different coordinators both claim the directory, and one
    // claim fails: every rank raised that agreed error, so every rank can
    // ask once more (only on this path) whether the options were the cause.
    if (e.agreed()) check_same_coordinator(gather_coordinators(comm, options.coordinator_rank));
    throw;
  } catch (...) {
    if (p->claimed) p->writer->discard();
    throw;
  }
  bool same_cached_plan = true;
  uint64_t first_cached = 0;
  std::vector<uint64_t> common_digests;
  std::vector<int32_t> coordinators;
  for (size_t r = 0; r < announced.size(); ++r) {
    const plan::PlanAnnouncement a = plan::decode_plan_announcement(announced[r], fmt::format("rank {}", r));
    coordinators.push_back(a.coordinator);
    p->plan_hashes.push_back(a.structure_hash);
    common_digests.push_back(a.common_hash);
    if (static_cast<int>(r) == p->coordinator) p->distckpt_save.save_id = a.save_id;
    if (r == 0) first_cached = a.cached_plan;
    same_cached_plan = same_cached_plan && a.cached_plan == first_cached;
  }
  p->plan_reused = same_cached_plan && first_cached != 0 && first_cached == plan_digest(p->plan_hashes);
  p->distckpt_save.plan_hashes = p->plan_hashes;

  try {
    // Every rank sees the same announcements, so every rank takes each step
    // below, or none.
    check_same_coordinator(coordinators);
    const bool common_differs =
        std::any_of(common_digests.begin(), common_digests.end(), [&](uint64_t d) { return d != common_digests[0]; });
    if (common_differs) {
      check_common_state(common_hashes, common_digests, options.common_state_check, p->coordinator, comm);
    }
    if (p->plan_reused) {
      plan_from_cache(*p, local, *cache, comm);
    } else {
      plan_from_scratch(*p, local, comm);
    }
    // distckpt's own writer lays nothing out (the plan is its layout): no
    // collective for it on the save path.
    p->distckpt_save.plan = p->global;
    if (!p->distckpt) {
      run_agreed(comm, "prepare the storage", [&] {
        if (p->is_coordinator()) p->writer->prepare(contents_of(*p->global, p->split.common));
      });
    }
  } catch (...) {
    if (p->claimed) p->writer->discard();
    throw;
  }
  if (cache) {
    cache->valid = true;
    cache->seed.reset();
    cache->hashes = p->plan_hashes;
    cache->assignment = p->assignment;
    cache->global = p->global;
    ++(p->plan_reused ? cache->reused : cache->made);
  }
  return p;
}

}  // namespace saving
}  // namespace distckpt
