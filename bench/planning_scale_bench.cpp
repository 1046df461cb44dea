// Planning cost at scale, by simulation (no processes), run with the
// runtime's own code on synthetic rank plans of a model of --tensors tensors
// on a tp x pp x dp mesh.
//
// --mode central: the central planner, all on the coordinator:
//   planning  decode every rank's plan (FlatBuffers) -> validate the global
//             sharding -> choose writers (balanced) -> metadata skeleton
//   metadata  decode every rank's write results -> fill the skeleton ->
//             encode metadata.fb
// --mode partitioned (what save() runs, plan/partitioned_plan.h): the real
// share of the busiest rank in each role, on the messages that rank would
// receive (built beforehand, as the senders' work):
//   rank      decode every rank's plan announcement, route its own plan
//   planner   the rank that plans the most descriptors: decode, validate,
//             group, send shared shards to balancers
//   balancer  the rank that balances the most holder sets
//   decide    the busiest planner again: apply the choices, tell the ranks
//   assemble  the coordinator: its own items + every planner's records ->
//             skeleton, files, slots
//   metadata  as above (write results come from the writers alone)
// --mode load: planning a fully parallel load of that checkpoint under the
//   same layout (every rank needs one piece per tensor of its stage, needed
//   by every dp replica; 8 ranks per host), partitioned
//   (load/read_planning.h), as each role's real share on the messages it
//   would receive: a rank routes its needs; the busiest scheduler schedules
//   its pieces; a rank merges its share from every scheduler. --before: as
//   the rounds exchange still plans, every rank decoding every rank's needs
//   and computing the whole schedule.
// --mode local_load: a tensor-aware state dict's to_state_dict, fully
//   parallel: each shard (tensor, tp rank) kept by one dp replica and needed
//   by the others; each role's real share of the partitioned exchange's
//   planning (local/shard_exchange.h: route, schedule, merge). --before:
//   every rank decoding every rank's needs and offers and balancing all.
// --mode local / dry_run: the partitioned steps a tensor-aware state dict's
//   fully parallel distribution / dry_run_save runs (the save's, without the
//   metadata; dry_run assembles the index on every rank).
// --mode strict: the *_ALL key check of a load of every tensor (nothing
//   missing), as each role's real share (load/strict_keys.h); --before: as
//   it was, every rank's key names all-gathered and merged on every rank.
// --mode open: a rank's opening of the checkpoint's metadata.fb and the
//   records a load decodes (format/metadata.h LazyMetadata: its stage's
//   tensors and its share of the scheduled pieces), against decoding it
//   whole as before; both read the whole file.
// Each tensor is [4096, 4096] bf16 on one pp stage, split on rows over tp and
// replicated over dp (4 MiB chunks, 1 MiB checksum blocks). tp = 8, pp = 16
// and dp = ranks / 128, so 512 ranks have dp = 4 and 4096 ranks dp = 32.
// Peak memory is the process's high-water mark over each phase
// (/proc/self/status VmHWM, reset through /proc/self/clear_refs).
#include <fmt/format.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "format/metadata.h"
#include "io/checksum.h"
#include "load/read_planning.h"
#include "load/strict_keys.h"
#include "local/messages.h"
#include "local/shard_exchange.h"
#include "plan/balance.h"
#include "plan/global_plan.h"
#include "plan/load_schedule.h"
#include "plan/local_plan.h"
#include "plan/messages.h"
#include "plan/partitioned_plan.h"

namespace {

using namespace distckpt;
using Clock = std::chrono::steady_clock;

constexpr int64_t kTp = 8, kPp = 16, kRows = 4096, kCols = 4096;

uint64_t status_kib(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  return 0;
}

// Freed memory goes back to the system first, so each phase's growth is its own.
void reset_peak() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

std::string tensor_key(int64_t t) { return fmt::format("decoder.layers.{}.weight_{}", t / 8, t % 8); }

// What `rank` holds of tensor `t` (on its stage): its tp rank's rows, its dp replica.
plan::ShardPlan shard_of(int64_t t, int rank) {
  const int64_t tp = rank % kTp, dp_rank = rank / (kTp * kPp);
  plan::ShardPlan s;
  s.key = tensor_key(t);
  s.dtype = at::kBFloat16;
  s.global_shape = {kRows, kCols};
  s.box = Box{{tp * kRows / kTp, 0}, {kRows / kTp, kCols}};
  s.replica_id = {dp_rank};
  return s;
}

plan::LocalPlan rank_plan(int rank, int64_t tensors) {
  plan::LocalPlan p;
  p.rank = rank;
  for (int64_t t = (rank / kTp) % kPp; t < tensors; t += kPp) p.tensors.push_back(shard_of(t, rank));
  return p;
}

struct Figures {
  double plan_s, metadata_s;
  double plan_peak_mb, metadata_peak_mb;
  uint64_t shard_plans, chunks, metadata_bytes;
};

// Every rank's write results (offsets and 1 MiB block checksums of its
// chunks), then the coordinator's part: decode them, fill the skeleton,
// encode metadata.fb.
void metadata_phase(plan::GlobalSavePlan& global, Figures& f) {
  const int ranks = static_cast<int>(global.slots.size());
  global.skeleton.checksum_block_size = uint64_t{1} << 20;
  std::vector<std::string> results(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    plan::WriteResults w;
    w.rank = r;
    for (const plan::WriteSlot& s : global.slots[static_cast<size_t>(r)]) {
      const uint64_t n = global.skeleton.tensors[s.index].chunks[s.chunk].byte_length;
      w.items.push_back({w.file_size, n, std::vector<uint64_t>((n + (1 << 20) - 1) >> 20, 0x5eed + r)});
      w.file_size += n;
    }
    results[static_cast<size_t>(r)] = plan::encode_write_results(w);
  }
  f.chunks = 0;
  for (const auto& slots : global.slots) f.chunks += slots.size();

  reset_peak();
  const uint64_t base2_kib = status_kib("VmRSS");
  const auto t0 = Clock::now();
  std::vector<plan::WriteResults> decoded;
  decoded.reserve(results.size());
  for (size_t r = 0; r < results.size(); ++r) decoded.push_back(plan::decode_write_results(results[r], "rank"));
  const CheckpointMetadata m = plan::fill_skeleton(global, decoded);
  const std::string bytes = encode_metadata(m);
  f.metadata_s = std::chrono::duration<double>(Clock::now() - t0).count();
  f.metadata_peak_mb = static_cast<double>(status_kib("VmHWM") - base2_kib) / 1024;
  f.metadata_bytes = bytes.size();
}

Figures simulate(int ranks, int64_t tensors) {
  // What the coordinator receives: one encoded plan per rank (made outside the timing).
  std::vector<std::string> encoded(static_cast<size_t>(ranks));
  uint64_t shard_plans = 0;
  for (int r = 0; r < ranks; ++r) {
    const plan::LocalPlan p = rank_plan(r, tensors);
    shard_plans += p.tensors.size();
    encoded[static_cast<size_t>(r)] = plan::encode_local_plan(p);
  }
  Figures f{};
  f.shard_plans = shard_plans;

  reset_peak();
  const uint64_t base_kib = status_kib("VmRSS");
  auto t0 = Clock::now();
  std::vector<plan::LocalPlan> plans;
  plans.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) plans.push_back(plan::decode_local_plan(encoded[static_cast<size_t>(r)], "rank"));
  plan::GlobalSavePlan global = plan::make_global_save_plan(plans, WriterPolicy::kBalanced);
  f.plan_s = std::chrono::duration<double>(Clock::now() - t0).count();
  f.plan_peak_mb = static_cast<double>(status_kib("VmHWM") - base_kib) / 1024;
  plans.clear();
  plans.shrink_to_fit();

  metadata_phase(global, f);
  return f;
}

// ---- Partitioned planning ---------------------------------------------------

// Holders of chunk `tp` of the tensors on stage `pp`: every dp replica, ascending.
std::vector<int> holders_of(int64_t tp, int64_t pp, int64_t dp) {
  std::vector<int> holders;
  holders.reserve(static_cast<size_t>(dp));
  for (int64_t d = 0; d < dp; ++d) holders.push_back(static_cast<int>(tp + kTp * pp + kTp * kPp * d));
  return holders;
}

constexpr uint64_t kChunkBytes = kRows / kTp * kCols * 2;

// The shared shard a planner sends for chunk `tp` of tensor `t`.
plan::SharedShard shared_shard_of(int64_t t, int64_t tp, std::vector<int> holders, uint32_t id) {
  plan::SharedShard s;
  s.name = tensor_key(t);
  s.box = Box{{tp * kRows / kTp, 0}, {kRows / kTp, kCols}};
  s.bytes = kChunkBytes;
  s.holders = std::move(holders);
  s.id = id;
  return s;
}

// writer[t * kTp + tp]: the rank the balanced policy picks for every chunk,
// one holder set at a time (as each balancer does for its sets).
std::vector<int> all_writers(int64_t tensors, int64_t dp) {
  std::vector<int> writer(static_cast<size_t>(tensors * kTp));
  for (int64_t pp = 0; pp < kPp; ++pp) {
    for (int64_t tp = 0; tp < kTp; ++tp) {
      std::vector<plan::SharedShard> set;
      const std::vector<int> holders = holders_of(tp, pp, dp);
      for (int64_t t = pp; t < tensors; t += kPp) set.push_back(shared_shard_of(t, tp, holders, 0));
      const std::vector<int> chosen = plan::balance_within_holder_sets(set);
      for (size_t k = 0; k < set.size(); ++k) {
        writer[static_cast<size_t>((pp + static_cast<int64_t>(k) * kPp) * kTp + tp)] = chosen[k];
      }
    }
  }
  return writer;
}

struct Step {
  const char* role;
  int rank;
  double seconds = 0;
  double peak_mb = 0;   // growth while it ran
  double input_mb = 0;  // the messages it received
};

template <typename F>
Step timed(const char* role, int rank, uint64_t input_bytes, F&& run) {
  reset_peak();
  const uint64_t base_kib = status_kib("VmRSS");
  const auto t0 = Clock::now();
  run();
  Step s{role, rank};
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  s.peak_mb = static_cast<double>(status_kib("VmHWM") - base_kib) / 1024;
  s.input_mb = static_cast<double>(input_bytes) / 1e6;
  return s;
}

uint64_t bytes_of(const std::vector<std::string>& messages) {
  uint64_t n = 0;
  for (const std::string& m : messages) n += m.size() + sizeof(std::string);
  return n;
}

// Who runs the partitioned steps: a save (announcements, records to the
// coordinator, metadata), a tensor-aware state dict (structure
// announcements, keepers only) or dry_run_save (no announcements, the index
// assembled on every rank).
enum class Planning { kSave, kLocal, kDryRun };

std::vector<Step> simulate_partitioned(int ranks, int64_t tensors, Figures& f, Planning who = Planning::kSave) {
  const int64_t dp = ranks / (kTp * kPp);
  std::vector<Step> steps;
  f.shard_plans = static_cast<uint64_t>(ranks) * static_cast<uint64_t>((tensors + kPp - 1) / kPp);

  // rank: every announcement decoded (prepare_save; a tensor-aware state
  // dict's cache check), its own plan routed.
  {
    const std::string announcement = who == Planning::kSave ? plan::encode_plan_announcement({0x1234, 0x99, 0x77, 0})
                                                            : local::encode_structure_announcement({0x1234, 0x99});
    const std::vector<std::string> announced(who == Planning::kDryRun ? 0 : static_cast<size_t>(ranks), announcement);
    const plan::LocalPlan own = rank_plan(0, tensors);
    steps.push_back(timed("rank", 0, bytes_of(announced), [&] {
      uint64_t sum = 1;
      for (size_t r = 0; r < announced.size(); ++r) {
        sum += who == Planning::kSave ? plan::decode_plan_announcement(announced[r], "rank").structure_hash
                                      : local::decode_structure_announcement(announced[r], "rank").structure_hash;
      }
      const std::vector<std::string> routed = plan::route_local_plan(own, ranks);
      if (sum == 0 || routed.empty()) std::abort();
    }));
  }

  // planner: the rank whose keys have the most descriptors (8 * dp each).
  std::vector<std::vector<int64_t>> keys_of(static_cast<size_t>(ranks));
  for (int64_t t = 0; t < tensors; ++t)
    keys_of[static_cast<size_t>(plan::planner_of(tensor_key(t), ranks))].push_back(t);
  const auto busiest = std::max_element(keys_of.begin(), keys_of.end(),
                                        [](const auto& a, const auto& b) { return a.size() < b.size(); });
  const int planner = static_cast<int>(busiest - keys_of.begin());
  const std::vector<int64_t> planner_keys = *busiest;
  keys_of.clear();
  keys_of.shrink_to_fit();
  std::vector<std::string> received(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const int64_t pp = (r / kTp) % kPp;
    plan::LocalPlan part;
    part.rank = r;
    std::vector<uint32_t> items;
    for (const int64_t t : planner_keys) {
      if (t % kPp != pp) continue;
      part.tensors.push_back(shard_of(t, r));
      items.push_back(static_cast<uint32_t>((t - pp) / kPp));
    }
    if (!part.tensors.empty()) received[static_cast<size_t>(r)] = plan::encode_plan_part(part, items);
  }
  plan::PlannerShare share;
  steps.push_back(timed("planner", planner, bytes_of(received), [&] {
    share = plan::plan_share(received, WriterPolicy::kBalanced, true);
    const std::vector<std::string> to_balancers = plan::shared_shards_by_balancer(share, ranks);
    if (to_balancers.size() != static_cast<size_t>(ranks)) std::abort();
  }));
  received.clear();
  received.shrink_to_fit();

  // balancer: the rank with the most holder sets (one per tp chunk and stage).
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> sets_of;  // balancer -> (tp, pp)
  for (int64_t pp = 0; pp < kPp; ++pp) {
    for (int64_t tp = 0; tp < kTp; ++tp) sets_of[plan::balancer_of(holders_of(tp, pp, dp), ranks)].emplace_back(tp, pp);
  }
  const auto most = std::max_element(sets_of.begin(), sets_of.end(),
                                     [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  {
    std::map<int, std::vector<plan::SharedShard>> by_planner;
    for (const auto& [tp, pp] : most->second) {
      const std::vector<int> holders = holders_of(tp, pp, dp);
      for (int64_t t = pp; t < tensors; t += kPp) {
        by_planner[plan::planner_of(tensor_key(t), ranks)].push_back(
            shared_shard_of(t, tp, holders, static_cast<uint32_t>(t)));
      }
    }
    std::vector<std::string> to_balancer(static_cast<size_t>(ranks));
    for (const auto& [p, shards] : by_planner) to_balancer[static_cast<size_t>(p)] = plan::encode_shared_shards(shards);
    by_planner.clear();
    steps.push_back(timed("balancer", most->first, bytes_of(to_balancer), [&] {
      const std::vector<std::string> answers = plan::balance_shares(to_balancer);
      if (answers.size() != static_cast<size_t>(ranks)) std::abort();
    }));
  }

  // decide: the busiest planner gets its shards' writers from the balancers.
  const std::vector<int> writer = all_writers(tensors, dp);
  {
    std::map<std::string, int64_t> index_of_key;
    for (const int64_t k : planner_keys) index_of_key[tensor_key(k)] = k;
    std::map<int, plan::WriterChoices> by_balancer;
    for (size_t i = 0; i < share.writer.size(); ++i) {
      if (share.writer[i] != plan::kShared) continue;
      const plan::SharedShard s = plan::shared_shard(share.plans, share.grouping, i);
      const int64_t key = index_of_key.at(s.name);
      const int64_t tp = s.box.offset[0] / (kRows / kTp);
      plan::WriterChoices& c = by_balancer[plan::balancer_of(s.holders, ranks)];
      c.ids.push_back(s.id);
      c.writers.push_back(writer[static_cast<size_t>(key * kTp + tp)]);
    }
    std::vector<std::string> choices(static_cast<size_t>(ranks));
    for (const auto& [b, c] : by_balancer) choices[static_cast<size_t>(b)] = plan::encode_writer_choices(c);
    steps.push_back(timed("decide", planner, bytes_of(choices), [&] {
      const std::vector<std::string> decisions =
          plan::decide_share(share, choices, ranks, who == Planning::kSave ? 0 : -1);
      if (decisions.size() != static_cast<size_t>(ranks)) std::abort();
    }));
  }
  share = {};

  // assemble: the coordinator (rank 0) merges every planner's records (a
  // dry run: every rank does).
  plan::GlobalSavePlan global;
  if (who != Planning::kLocal) {
    std::map<int, plan::PlanDecision> by_planner;
    const plan::LocalPlan own = rank_plan(0, tensors);
    for (int64_t t = 0; t < tensors; ++t) {
      plan::PlanDecision& d = by_planner[plan::planner_of(tensor_key(t), ranks)];
      plan::PlannedTensor record{tensor_key(t), at::kBFloat16, {kRows, kCols}, {}};
      for (int64_t tp = 0; tp < kTp; ++tp) {
        const int w = writer[static_cast<size_t>(t * kTp + tp)];
        record.chunks.push_back({Box{{tp * kRows / kTp, 0}, {kRows / kTp, kCols}}, std::nullopt, w});
        if (w == 0) d.items.push_back(static_cast<uint32_t>(t / kPp));
      }
      d.records.tensors.push_back(std::move(record));
    }
    std::vector<std::string> decisions(static_cast<size_t>(ranks));
    for (auto& [p, d] : by_planner) {
      std::sort(d.records.tensors.begin(), d.records.tensors.end(),
                [](const plan::PlannedTensor& a, const plan::PlannedTensor& b) { return a.key < b.key; });
      decisions[static_cast<size_t>(p)] = plan::encode_plan_decision(d);
    }
    by_planner.clear();
    steps.push_back(timed(who == Planning::kSave ? "assemble" : "assemble (every rank)", 0, bytes_of(decisions), [&] {
      const std::vector<uint32_t> mine = plan::assignment_from_decisions(decisions, own);
      global = plan::global_plan_from_decisions(decisions, ranks);
      if (mine.size() > own.item_count()) std::abort();
    }));
  }
  f.plan_s = 0;
  f.plan_peak_mb = 0;
  for (const Step& s : steps) {
    f.plan_s += s.seconds;
    f.plan_peak_mb += s.peak_mb + s.input_mb;
  }
  if (who == Planning::kSave) metadata_phase(global, f);
  return steps;
}

struct LoadFigures {
  uint64_t needs = 0;
  double gathered_mb = 0, seconds = 0, peak_mb = 0;
  size_t shared = 0;
};

// One rank's planning of a load by `ranks` ranks: every rank needs its tp
// rows of each tensor of its stage, which is one stored piece (written by
// dp rank 0), needed by all dp replicas.
LoadFigures simulate_load(int ranks, int64_t tensors) {
  std::vector<std::string> encoded(static_cast<size_t>(ranks));
  LoadFigures f{};
  for (int r = 0; r < ranks; ++r) {
    std::vector<plan::PieceNeed> needs;
    for (int64_t t = (r / kTp) % kPp; t < tensors; t += kPp) {
      const plan::ShardPlan s = shard_of(t, r);
      needs.push_back({static_cast<uint32_t>(t), static_cast<uint32_t>(r % kTp), s.box});
    }
    f.needs += needs.size();
    encoded[static_cast<size_t>(r)] = plan::encode_needs(r, needs);
    f.gathered_mb += static_cast<double>(encoded[static_cast<size_t>(r)].size()) / 1e6;
  }
  const plan::PieceLookup lookup = [](uint32_t, uint32_t piece) {
    return plan::PieceGeometry{Box{{piece * kRows / kTp, 0}, {kRows / kTp, kCols}}, 2, {}};
  };
  reset_peak();
  const uint64_t base_kib = status_kib("VmRSS");
  const auto t0 = Clock::now();
  std::vector<std::vector<plan::PieceNeed>> needs;
  needs.reserve(encoded.size());
  for (const std::string& e : encoded) needs.push_back(plan::decode_needs(e, "rank"));
  const plan::LoadSchedule schedule = plan::make_load_schedule(needs, lookup, uint64_t{16} << 20, true);
  f.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  f.peak_mb = static_cast<double>(status_kib("VmHWM") - base_kib) / 1024;
  f.shared = schedule.shared.size();
  return f;
}

// The needs of `rank`: its tp rows of each tensor of its stage, one stored piece each.
std::vector<plan::PieceNeed> load_needs(int rank, int64_t tensors) {
  std::vector<plan::PieceNeed> needs;
  for (int64_t t = (rank / kTp) % kPp; t < tensors; t += kPp) {
    needs.push_back({static_cast<uint32_t>(t), static_cast<uint32_t>(rank % kTp), shard_of(t, rank).box});
  }
  return needs;
}

std::string host_of(int rank) { return fmt::format("node-{}", rank / 8); }

// Partitioned load planning (load/read_planning.h): each role's real share.
std::vector<Step> simulate_partitioned_load(int ranks, int64_t tensors, uint64_t& all_needs) {
  loading::PieceCatalog catalog;
  catalog.lookup = [](uint32_t, uint32_t piece) {
    return plan::PieceGeometry{Box{{piece * kRows / kTp, 0}, {kRows / kTp, kCols}}, 2, {}};
  };
  catalog.check = [](const std::vector<plan::PieceNeed>&, int) {};
  loading::ReadEngineOptions options;
  options.slab_bytes = uint64_t{8} << 20;
  const auto reads_of = [&](int rank) {
    std::vector<std::vector<loading::TensorRead>> rounds(1);
    for (const plan::PieceNeed& n : load_needs(rank, tensors)) rounds[0].push_back({n, at::Tensor()});
    return rounds;
  };
  all_needs = static_cast<uint64_t>(ranks) * static_cast<uint64_t>((tensors + kPp - 1) / kPp);
  // The pieces of each scheduler, and the busiest one.
  std::map<int, std::vector<std::pair<uint32_t, uint32_t>>> pieces_of;
  for (uint32_t t = 0; t < tensors; ++t) {
    for (uint32_t p = 0; p < kTp; ++p) pieces_of[loading::scheduler_of(t, p, ranks)].emplace_back(t, p);
  }
  const int busiest = std::max_element(pieces_of.begin(), pieces_of.end(), [](const auto& a, const auto& b) {
                        return a.second.size() < b.second.size();
                      })->first;
  // What every rank sends scheduler `s` (built beforehand, as the senders' work).
  const std::string nothing = plan::encode_read_plan("", {std::string()});
  const auto routed_to = [&](int s) {
    std::vector<std::string> routed(static_cast<size_t>(ranks), nothing);
    std::map<int, std::vector<plan::PieceNeed>> needs;
    std::map<int, std::vector<uint32_t>> indices;
    for (const auto& [t, p] : pieces_of[s]) {
      for (int r = static_cast<int>((t % kPp) * kTp + p); r < ranks; r += kTp * kPp) {
        needs[r].push_back({t, p, shard_of(t, r).box});
        indices[r].push_back(t / kPp);
      }
    }
    for (const auto& [r, n] : needs) {
      routed[static_cast<size_t>(r)] =
          plan::encode_read_plan(host_of(r), {plan::encode_needs(r, n, indices[static_cast<int>(r)])});
    }
    return routed;
  };
  const auto bytes_of = [](const std::vector<std::string>& messages) {
    uint64_t n = 0;
    for (const std::string& m : messages) n += m.size();
    return n;
  };
  std::vector<Step> steps;
  {
    const auto rounds = reads_of(0);
    steps.push_back(timed("route (each rank)", 0, 0, [&] {
      if (loading::route_read_plan(rounds, 0, ranks, host_of(0)).size() != static_cast<size_t>(ranks)) std::abort();
    }));
  }
  {
    const std::vector<std::string> routed = routed_to(busiest);
    steps.push_back(timed("schedule (busiest scheduler)", busiest, bytes_of(routed),
                          [&] { loading::schedule_routed_needs(catalog, routed, options, busiest); }));
  }
  {
    // What rank 0 gets from every scheduler: its shares from the schedulers
    // of its pieces (each run on everything routed to it), the round count
    // from the others.
    std::vector<std::string> told(static_cast<size_t>(ranks), plan::encode_share_message(1, {nullptr}, {}));
    std::set<int> schedulers;
    for (const plan::PieceNeed& n : load_needs(0, tensors))
      schedulers.insert(loading::scheduler_of(n.tensor, n.piece, ranks));
    for (const int s : schedulers) {
      told[static_cast<size_t>(s)] = loading::schedule_routed_needs(catalog, routed_to(s), options, s)[0];
    }
    const std::vector<std::vector<plan::PieceNeed>> mine = {load_needs(0, tensors)};
    steps.push_back(timed("merge (each rank)", 0, bytes_of(told), [&] {
      std::vector<plan::LoadShare> shares;
      std::vector<bool> within_host;
      loading::merge_shares(catalog, told, mine, 0, shares, within_host);
    }));
  }
  return steps;
}

// ---- Tensor-aware state dicts: to_state_dict's exchange of kept shards --------

std::string shard_id(uint32_t t, int64_t tp) { return fmt::format("{}/{}", t, tp); }

// The dp replica (0 .. dp - 1) that keeps shard (t, tp).
int64_t keeper_replica(uint32_t t, int64_t dp) { return static_cast<int64_t>(t) % dp; }

// What `rank` keeps and needs: of each tensor of its stage, its tp shard.
void shards_of(int rank, int ranks, int64_t tensors, std::vector<local::KeptShard>& kept,
               std::vector<local::NeededShard>& needed) {
  const int64_t dp = ranks / (kTp * kPp), replica = rank / (kTp * kPp);
  const at::Tensor one = at::empty({1}, at::kBFloat16);  // planning does not depend on the sizes
  for (int64_t t = (rank / kTp) % kPp; t < tensors; t += kPp) {
    const std::string id = shard_id(static_cast<uint32_t>(t), rank % kTp);
    if (keeper_replica(static_cast<uint32_t>(t), dp) == replica) {
      kept.push_back({id, one});
    } else {
      needed.push_back({id, id, one});
    }
  }
}

std::vector<Step> simulate_local_load(int ranks, int64_t tensors, bool before, uint64_t& all_needs) {
  const int64_t dp = ranks / (kTp * kPp);
  all_needs = static_cast<uint64_t>(ranks / dp) * static_cast<uint64_t>((tensors + kPp - 1) / kPp) *
              static_cast<uint64_t>(dp - 1);
  std::vector<Step> steps;
  if (before) {
    // Every rank's needs and offers, all-gathered (built beforehand), then on every rank: decode all, match, balance.
    std::vector<std::string> needs(static_cast<size_t>(ranks)), offers(static_cast<size_t>(ranks));
    uint64_t bytes = 0;
    for (int r = 0; r < ranks; ++r) {
      std::vector<local::KeptShard> kept;
      std::vector<local::NeededShard> needed;
      shards_of(r, ranks, tensors, kept, needed);
      std::vector<local::ShardNeedMessage> n;
      for (const auto& x : needed) n.push_back({x.identity, 2});
      std::vector<std::string> o;
      for (const auto& x : kept) o.push_back(x.identity);
      needs[static_cast<size_t>(r)] = local::encode_shard_needs(n);
      offers[static_cast<size_t>(r)] = local::encode_shard_offers(o);
      bytes += needs[static_cast<size_t>(r)].size() + offers[static_cast<size_t>(r)].size();
    }
    steps.push_back(timed("every rank (before)", 0, bytes, [&] {
      std::vector<std::vector<local::ShardNeedMessage>> decoded;
      for (const std::string& m : needs) decoded.push_back(local::decode_shard_needs(m, "rank"));
      std::map<std::string, std::vector<int>> keepers;
      for (int r = 0; r < ranks; ++r) {
        for (std::string& id : local::decode_shard_offers(offers[static_cast<size_t>(r)], "rank")) {
          keepers[std::move(id)].push_back(r);
        }
      }
      std::vector<plan::BalanceItem> items;
      for (const auto& rank_needs : decoded) {
        for (const auto& n : rank_needs) items.push_back({n.bytes, keepers.at(n.identity)});
      }
      plan::balance_least_loaded(items, std::vector<uint64_t>(static_cast<size_t>(ranks), 0));
    }));
    return steps;
  }
  // The schedulers of every identity, and the busiest one.
  std::map<int, std::vector<std::pair<uint32_t, int64_t>>> ids_of;
  for (uint32_t t = 0; t < tensors; ++t) {
    for (int64_t p = 0; p < kTp; ++p) ids_of[plan::planner_of(shard_id(t, p), ranks)].emplace_back(t, p);
  }
  const int busiest = std::max_element(ids_of.begin(), ids_of.end(), [](const auto& a, const auto& b) {
                        return a.second.size() < b.second.size();
                      })->first;
  std::vector<local::KeptShard> kept;
  std::vector<local::NeededShard> needed;
  shards_of(0, ranks, tensors, kept, needed);
  std::map<std::string, uint32_t> index_at_0;  // rank 0's need indices, whose merge is timed
  for (uint32_t i = 0; i < needed.size(); ++i) index_at_0[needed[i].identity] = i;
  // What every rank routes scheduler `s` (built beforehand, as the senders' work).
  const auto routed_to = [&](int s) {
    std::map<int, local::ShardRouting> parts;
    for (const auto& [t, p] : ids_of[s]) {
      for (int64_t j = 0; j < dp; ++j) {
        const int r = static_cast<int>((t % kPp) * kTp + p + j * kTp * kPp);
        if (keeper_replica(t, dp) == j) {
          parts[r].kept.push_back(shard_id(t, p));
        } else {
          parts[r].needs.push_back({shard_id(t, p), 2});
          parts[r].indices.push_back(r == 0 ? index_at_0.at(shard_id(t, p)) : static_cast<uint32_t>(t / kPp));
        }
      }
    }
    std::vector<std::string> routed(static_cast<size_t>(ranks));
    for (const auto& [r, part] : parts) routed[static_cast<size_t>(r)] = local::encode_shard_routing(part);
    return routed;
  };
  const auto bytes_of = [](const std::vector<std::string>& messages) {
    uint64_t n = 0;
    for (const std::string& m : messages) n += m.size();
    return n;
  };
  std::map<int, std::vector<size_t>> routed_kept;
  steps.push_back(timed("route (each rank)", 0, 0, [&] { local::route_shards(kept, needed, ranks, routed_kept); }));
  {
    const std::vector<std::string> routed = routed_to(busiest);
    steps.push_back(timed("schedule (busiest scheduler)", busiest, bytes_of(routed),
                          [&] { local::schedule_shard_transfers(routed, busiest, uint64_t{32} << 20); }));
  }
  {
    std::vector<std::string> answers(static_cast<size_t>(ranks));
    std::set<int> schedulers;
    for (const auto& k : kept) schedulers.insert(plan::planner_of(k.identity, ranks));
    for (const auto& n : needed) schedulers.insert(plan::planner_of(n.identity, ranks));
    for (const int s : schedulers) {
      answers[static_cast<size_t>(s)] = local::schedule_shard_transfers(routed_to(s), s, uint64_t{32} << 20)[0];
    }
    steps.push_back(timed("merge (each rank)", 0, bytes_of(answers),
                          [&] { local::merge_shard_transfers(answers, 0, kept, needed, routed_kept); }));
  }
  return steps;
}

// ---- Strict key handling, *_ALL modes -----------------------------------------

struct StrictFigures {
  double before_s = 0, before_peak_mb = 0, before_messages_mb = 0;
  std::vector<Step> after;
};

// The keys rank `rank` requests: every tensor of its stage.
std::vector<std::string> requested_keys(int rank, int64_t tensors) {
  std::vector<std::string> keys;
  for (int64_t t = (rank / kTp) % kPp; t < tensors; t += kPp) keys.push_back(tensor_key(t));
  return keys;
}

// A load of every tensor with strict handling *_ALL (nothing missing). Before:
// every rank all-gathered every rank's key names (a vector of strings each,
// the wire shape UnrequestedKeys::names has) and checked the stored keys
// against their union. After (load/strict_keys.h): a rank routes its keys'
// digests to their owners; the owner that receives the most checks its
// stored keys; every rank reads the owners' answers (one per rank, empty
// when nothing is missing).
StrictFigures simulate_strict(int ranks, int64_t tensors, bool before) {
  StrictFigures f;
  // The checkpoint's keys in place order (sorted), looked up as a reader does.
  std::vector<int64_t> tensor_at(static_cast<size_t>(tensors));
  for (int64_t t = 0; t < tensors; ++t) tensor_at[static_cast<size_t>(t)] = t;
  std::sort(tensor_at.begin(), tensor_at.end(), [](int64_t a, int64_t b) { return tensor_key(a) < tensor_key(b); });
  std::vector<std::string> sorted_keys;
  for (const int64_t t : tensor_at) sorted_keys.push_back(tensor_key(t));
  const auto place_of = [&](const std::string& k) -> std::optional<size_t> {
    const auto it = std::lower_bound(sorted_keys.begin(), sorted_keys.end(), k);
    if (it == sorted_keys.end() || *it != k) return std::nullopt;
    return static_cast<size_t>(it - sorted_keys.begin());
  };
  loading::StoredKeys stored;
  stored.where = "the checkpoint";
  stored.lookup = loading::StoredKeys::Lookup{sorted_keys.size(), place_of, [&](size_t i) { return sorted_keys[i]; }};
  if (before) {
    // Ranks of one stage send the same names: one message per stage, decoded once per rank.
    std::vector<std::string> by_stage;
    uint64_t gathered = 0;
    for (int64_t pp = 0; pp < kPp; ++pp) {
      by_stage.push_back(plan::encode_unrequested_keys({{}, requested_keys(static_cast<int>(pp * kTp), tensors)}));
    }
    for (int r = 0; r < ranks; ++r) gathered += by_stage[static_cast<size_t>((r / kTp) % kPp)].size();
    f.before_messages_mb = static_cast<double>(gathered) / 1e6;
    const Step s = timed("every rank", 0, gathered, [&] {
      std::set<std::string> everywhere;
      for (int r = 0; r < ranks; ++r) {
        for (std::string& k :
             plan::decode_unrequested_keys(by_stage[static_cast<size_t>((r / kTp) % kPp)], "rank").names)
          everywhere.insert(std::move(k));
      }
      size_t missing = 0;
      for (const std::string& k : sorted_keys) missing += everywhere.count(k) ? 0 : 1;
      if (missing != 0) std::abort();
    });
    f.before_s = s.seconds;
    f.before_peak_mb = s.peak_mb + s.input_mb;
    return f;
  }

  {  // rank: its request's digests routed to their owners
    StateDict request = Value::dict();
    for (const std::string& k : requested_keys(0, tensors)) {
      request[k] = ShardedTensor::from_rank_offsets(k, at::empty({1}), {});
    }
    f.after.push_back(timed("rank (route)", 0, 0, [&] {
      const std::vector<std::string> routed = loading::route_key_digests(request, stored, ranks);
      if (routed.size() != static_cast<size_t>(ranks)) std::abort();
    }));
  }
  {  // owner: the one receiving the most places checks the stored keys it owns
    std::vector<uint64_t> load_of(static_cast<size_t>(ranks), 0);
    for (size_t place = 0; place < sorted_keys.size(); ++place) {
      load_of[place % static_cast<size_t>(ranks)] += static_cast<uint64_t>(ranks / kPp);  // its stage's ranks ask
    }
    const int owner = static_cast<int>(std::max_element(load_of.begin(), load_of.end()) - load_of.begin());
    std::vector<std::string> routed(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      plan::KeyDigests d;
      for (size_t place = static_cast<size_t>(owner); place < sorted_keys.size(); place += static_cast<size_t>(ranks)) {
        if (tensor_at[place] % kPp == (r / kTp) % kPp) d.requested_places.push_back(place);
      }
      if (!d.requested_places.empty()) routed[static_cast<size_t>(r)] = plan::encode_key_digests(d);
    }
    f.after.push_back(timed("owner (check)", owner, bytes_of(routed), [&] {
      if (!loading::owned_unrequested_keys(stored, routed, owner, ranks).names.empty()) std::abort();
    }));
  }
  {  // rank: every owner's answer (all empty: nothing missing)
    const std::vector<std::string> answers(static_cast<size_t>(ranks));
    f.after.push_back(timed("rank (answers)", 0, bytes_of(answers), [&] {
      size_t names = 0;
      for (size_t r = 0; r < answers.size(); ++r) {
        if (!answers[r].empty()) names += plan::decode_unrequested_keys(answers[r], "rank").names.size();
      }
      if (names != 0) std::abort();
    }));
  }
  return f;
}

// ---- Opening the checkpoint -------------------------------------------------

// The metadata.fb a save of the model writes: each (tensor, tp rank) chunk
// written by one dp replica (spread over the replicas), one file per writer.
std::string checkpoint_metadata(int ranks, int64_t tensors) {
  const int64_t dp = ranks / (kTp * kPp);
  std::vector<int64_t> by_key(static_cast<size_t>(tensors));
  for (int64_t t = 0; t < tensors; ++t) by_key[static_cast<size_t>(t)] = t;
  std::sort(by_key.begin(), by_key.end(), [](int64_t a, int64_t b) { return tensor_key(a) < tensor_key(b); });
  CheckpointMetadata m;
  m.world_size = ranks;
  m.checksum_block_size = uint64_t{1} << 20;
  std::map<int64_t, uint32_t> file_of;  // writer rank -> file
  constexpr uint64_t kChunkBytes = kRows / kTp * kCols * 2;
  for (const int64_t t : by_key) {
    TensorRecord& record = m.tensors.emplace_back();
    record.key = tensor_key(t);
    record.dtype = at::kBFloat16;
    record.global_shape = {kRows, kCols};
    for (int64_t tp = 0; tp < kTp; ++tp) {
      const int64_t writer = (t / kPp) % dp * (kTp * kPp) + (t % kPp) * kTp + tp;
      const auto [it, added] = file_of.emplace(writer, static_cast<uint32_t>(m.files.size()));
      if (added) m.files.push_back({fmt::format("data/rank_{}.bin", writer), 0, static_cast<int32_t>(writer)});
      FileRecord& file = m.files[it->second];
      record.chunks.push_back({Box{{tp * kRows / kTp, 0}, {kRows / kTp, kCols}}, std::nullopt, it->second, file.size,
                               kChunkBytes,
                               std::vector<uint64_t>(kChunkBytes >> 20, 0x5eed + static_cast<uint64_t>(t))});
      file.size += kChunkBytes;
    }
  }
  return encode_metadata(m);
}

struct OpenFigures {
  double metadata_mb = 0, head_mb = 0, read_mb = 0;
  size_t files = 0, records = 0;
  Step before, after, ranged;
};

// One rank's opening of the checkpoint and the records a load looks up:
// before, metadata.fb decoded whole (every record); after (LazyMetadata), its
// frame and files, then the records of the rank's keys (one pp stage) and of
// its share of the pieces it schedules for others (pieces / ranks, rounded up).
OpenFigures simulate_open(int ranks, int64_t tensors) {
  OpenFigures f;
  const std::string bytes = checkpoint_metadata(ranks, tensors);
  f.metadata_mb = static_cast<double>(bytes.size()) / 1e6;
  f.before = timed("whole file read and decoded", 0, bytes.size(), [&] {
    const CheckpointMetadata m = decode_metadata(bytes, "metadata.fb");
    f.files = m.files.size();
    if (m.tensors.size() != static_cast<size_t>(tensors)) std::abort();
  });
  std::string copy = bytes;  // what the storage read; handed over, not copied again
  const std::vector<std::string> keys = requested_keys(0, tensors);
  const auto scheduled = static_cast<size_t>((tensors * kTp + ranks - 1) / ranks);
  const auto own_records = [&](LazyMetadata& lazy) {
    std::vector<TensorRecord> decoded;
    for (const std::string& k : keys) decoded.push_back(lazy.tensor(*lazy.find(k)));
    for (size_t i = 0; i < scheduled; ++i) decoded.push_back(lazy.tensor((i * 7919) % lazy.tensor_count()));
    // What a load asks of each chunk's file (its writer, its path to open).
    for (const TensorRecord& t : decoded) {
      for (const ChunkRecord& c : t.chunks) {
        if (lazy.file(c.file).path.empty()) std::abort();
      }
    }
    f.records = decoded.size();
  };
  f.after = timed("whole file read, own records decoded", 0, bytes.size(), [&] {
    LazyMetadata lazy(std::move(copy), "metadata.fb");
    own_records(lazy);
  });
  // Format 3 from its head: each record read (here copied from memory) when
  // first looked up; what it reads is counted.
  const uint64_t head = metadata_head_bytes(bytes);
  f.head_mb = static_cast<double>(head) / 1e6;
  f.ranged = timed("head read, own records read and decoded", 0, head, [&] {
    LazyMetadata lazy(
        bytes.substr(0, head), bytes.size(),
        [&](uint64_t offset, uint64_t length, uint8_t* out) { std::memcpy(out, bytes.data() + offset, length); },
        "metadata.fb");
    own_records(lazy);
    f.read_mb = static_cast<double>(lazy.bytes_read()) / 1e6;
  });
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt planning cost at scale (simulated ranks, no processes)"};
  std::vector<int> ranks{512, 1024, 2048, 4096};
  int64_t tensors = 10000;
  std::string mode = "partitioned";
  app.add_option("--ranks", ranks, "simulated world sizes (multiples of 128)");
  app.add_option("--tensors", tensors, "tensors in the model");
  bool before = false;
  app.add_option(
         "--mode", mode,
         "partitioned (what save runs), central (everything on the coordinator), load (a load's "
         "planning on each rank), strict (the *_ALL key check of a load), local (a tensor-aware state "
         "dict's fully parallel distribution), dry_run (dry_run_save), local_load (to_state_dict's exchange) or "
         "open (a rank's opening of the checkpoint and the metadata records it decodes)")
      ->check(CLI::IsMember({"partitioned", "central", "load", "strict", "local", "dry_run", "local_load", "open"}));
  app.add_flag("--before", before,
               "strict: the check as it was, every rank's key names all-gathered; load, local_load: every rank "
               "plans everything");
  CLI11_PARSE(app, argc, argv);
  for (const int r : ranks) {
    if (r % (kTp * kPp) != 0) {
      fmt::print(stderr, "--ranks must be multiples of {}\n", kTp * kPp);
      return 2;
    }
  }

  fmt::print("tensors {}  mesh tp={} pp={} dp=ranks/128  (balanced writers, {} planning)\n", tensors, kTp, kPp, mode);
  if (mode == "local_load") {
    fmt::print(
        "| ranks | needs (all ranks) | role | busiest rank | s | peak growth + messages MB | messages in MB "
        "|\n|---|---|---|---|---|---|---|\n");
    for (const int r : ranks) {
      uint64_t needs = 0;
      for (const Step& s : simulate_local_load(r, tensors, before, needs)) {
        fmt::print("| {} | {} | {} | {} | {:.4f} | {:.1f} | {:.2f} |\n", r, needs, s.role, s.rank, s.seconds,
                   s.peak_mb + s.input_mb, s.input_mb);
      }
    }
    return 0;
  }
  if (mode == "load" && before) {
    fmt::print(
        "| ranks | needs (all ranks) | gathered needs MB | shared pieces | each rank: s | each rank: peak growth MB "
        "|\n|---|---|---|---|---|---|\n");
    for (const int r : ranks) {
      const LoadFigures f = simulate_load(r, tensors);
      fmt::print("| {} | {} | {:.1f} | {} | {:.2f} | {:.0f} |\n", r, f.needs, f.gathered_mb, f.shared, f.seconds,
                 f.peak_mb);
    }
    return 0;
  }
  if (mode == "load") {
    fmt::print(
        "| ranks | needs (all ranks) | role | busiest rank | s | peak growth + messages MB | messages in MB "
        "|\n|---|---|---|---|---|---|---|\n");
    for (const int r : ranks) {
      uint64_t needs = 0;
      double total_s = 0, total_mb = 0;
      for (const Step& s : simulate_partitioned_load(r, tensors, needs)) {
        fmt::print("| {} | {} | {} | {} | {:.4f} | {:.1f} | {:.2f} |\n", r, needs, s.role, s.rank, s.seconds,
                   s.peak_mb + s.input_mb, s.input_mb);
        total_s += s.seconds;
        total_mb += s.peak_mb + s.input_mb;
      }
      fmt::print("| {} | {} | all roles on one rank (bound) | | **{:.4f}** | **{:.1f}** | |\n", r, needs, total_s,
                 total_mb);
    }
    return 0;
  }
  if (mode == "strict") {
    fmt::print(
        "| ranks | check | busiest rank | s | peak growth + messages MB | messages in MB "
        "|\n|---|---|---|---|---|---|\n");
    for (const int r : ranks) {
      const StrictFigures f = simulate_strict(r, tensors, before);
      if (before) {
        fmt::print("| {} | all-gather of key names (before) | every rank | {:.3f} | {:.0f} | {:.1f} |\n", r, f.before_s,
                   f.before_peak_mb, f.before_messages_mb);
      }
      double total_s = 0, total_mb = 0;
      for (const Step& s : f.after) {
        fmt::print("| {} | {} | {} | {:.4f} | {:.1f} | {:.2f} |\n", r, s.role, s.rank, s.seconds,
                   s.peak_mb + s.input_mb, s.input_mb);
        total_s += s.seconds;
        total_mb += s.peak_mb + s.input_mb;
      }
      if (!f.after.empty()) {
        fmt::print("| {} | all steps on one rank (bound) | | **{:.4f}** | **{:.1f}** | |\n", r, total_s, total_mb);
      }
    }
    return 0;
  }
  if (mode == "open") {
    fmt::print(
        "| ranks | metadata.fb MB | files | opening | records decoded | MB read | s | peak growth MB |\n"
        "|---|---|---|---|---|---|---|---|\n");
    for (const int r : ranks) {
      const OpenFigures f = simulate_open(r, tensors);
      fmt::print("| {} | {:.1f} | {} | {} | {} | {:.1f} | {:.4f} | {:.1f} |\n", r, f.metadata_mb, f.files,
                 f.before.role, tensors, f.metadata_mb, f.before.seconds, f.before.peak_mb);
      fmt::print("| {} | {:.1f} | {} | {} | {} | {:.1f} | {:.4f} | {:.1f} |\n", r, f.metadata_mb, f.files, f.after.role,
                 f.records, f.metadata_mb, f.after.seconds, f.after.peak_mb);
      fmt::print("| {} | {:.1f} | {} | {} (head {:.2f} MB) | {} | **{:.2f}** | {:.4f} | {:.1f} |\n", r, f.metadata_mb,
                 f.files, f.ranged.role, f.head_mb, f.records, f.read_mb, f.ranged.seconds, f.ranged.peak_mb);
    }
    return 0;
  }
  if (mode == "central") {
    fmt::print(
        "| ranks | shard plans | chunks written | planning s | planning peak MB | metadata s | metadata peak MB | "
        "metadata.fb MB | planning s per 1M shard plans |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const int r : ranks) {
      const Figures f = simulate(r, tensors);
      fmt::print("| {} | {} | {} | {:.2f} | {:.0f} | {:.2f} | {:.0f} | {:.1f} | {:.2f} |\n", r, f.shard_plans, f.chunks,
                 f.plan_s, f.plan_peak_mb, f.metadata_s, f.metadata_peak_mb,
                 static_cast<double>(f.metadata_bytes) / 1e6, f.plan_s / (static_cast<double>(f.shard_plans) / 1e6));
    }
    return 0;
  }
  fmt::print(
      "| ranks | shard plans | role | busiest rank | s | peak growth MB | messages in MB |\n"
      "|---|---|---|---|---|---|---|\n");
  if (mode == "local" || mode == "dry_run") {
    // The save's partitioned steps without the metadata: a tensor-aware
    // state dict stops once the writers (keepers) are decided; a dry run
    // then assembles the index on every rank from every planner's records.
    for (const int r : ranks) {
      Figures f{};
      double total_s = 0, total_mb = 0;
      for (const Step& s :
           simulate_partitioned(r, tensors, f, mode == "local" ? Planning::kLocal : Planning::kDryRun)) {
        const bool everywhere = std::string(s.role) == "assemble (every rank)";
        fmt::print("| {} | {} | {} | {} | {:.3f} | {:.1f} | {:.1f} |\n", r, f.shard_plans, s.role,
                   everywhere ? "all" : std::to_string(s.rank), s.seconds, s.peak_mb, s.input_mb);
        total_s += s.seconds;
        total_mb += s.peak_mb + s.input_mb;
      }
      fmt::print("| {} | {} | all roles on one rank (bound) | | **{:.3f}** | **{:.1f}** (growth + messages) | |\n", r,
                 f.shard_plans, total_s, total_mb);
    }
    return 0;
  }
  for (const int r : ranks) {
    Figures f{};
    const std::vector<Step> steps = simulate_partitioned(r, tensors, f);
    for (const Step& s : steps) {
      fmt::print("| {} | {} | {} | {} | {:.3f} | {:.1f} | {:.1f} |\n", r, f.shard_plans, s.role, s.rank, s.seconds,
                 s.peak_mb, s.input_mb);
    }
    fmt::print("| {} | {} | all roles on one rank (bound) | | **{:.3f}** | **{:.1f}** (growth + messages) | |\n", r,
               f.shard_plans, f.plan_s, f.plan_peak_mb);
    fmt::print("| {} | {} | metadata (coordinator, at commit) | 0 | {:.3f} | {:.1f} | |\n", r, f.shard_plans,
               f.metadata_s, f.metadata_peak_mb);
  }
  return 0;
}
