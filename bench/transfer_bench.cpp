// Live resharding: transfer() of a GPT-like state from one mesh to another,
// next to a save plus a load of the same state through local disk in the
// same run (the way to reshard without transfer).
//
// The state: layers of width --hidden (qkv and fc1 split on rows over tp,
// proj and fc2 on columns), stages of layers over pp, until --mb MiB.
// Scenarios:
//   reshard   every rank holds tp 2 x pp 2 (x dp = world / 4 copies) and asks
//             for tp 4 (x dp = world / 4): the same ranks change layout;
//   separate  ranks 0-3 hold tp 2 x pp 2, the other ranks (--dest-ranks of
//             them, the rest idle) ask for tp = --dest-ranks, pp 1.
// Reported (each the median of --reps, timed between barriers): the
// transfer with a cached plan, with and without the digest check, its first
// (planning) run, and the save plus load; the planning share of a cached
// transfer (the slowest rank's), the bytes every rank sent point to point
// against the bytes the destinations needed from other ranks (computed from
// the layouts), and the peak RSS a transfer adds to each rank (VmHWM after
// it, reset by /proc/self/clear_refs, minus VmRSS before). The floor: every
// rank copying the bytes it needs from others once within its own memory,
// the least a transfer that read the senders' memory directly would cost.
// Run under distckpt-launch -n 8 (reshard) or -n 6 (separate).
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "bench_timer.h"
#include "distckpt/distckpt.h"
#include "io/file.h"
#include "support/counting_communicator.h"

namespace {

using namespace distckpt;

struct Layer {
  std::string name;
  int64_t rows_mult, cols_mult;  // shape = [rows_mult * h, cols_mult * h]
  int64_t split_axis;            // over tp
};
const std::vector<Layer> kLayer{{"self_attention.linear_qkv.weight", 3, 1, 0},
                                {"self_attention.linear_proj.weight", 1, 1, 1},
                                {"mlp.linear_fc1.weight", 4, 1, 0},
                                {"mlp.linear_fc2.weight", 1, 4, 1}};

struct Mesh {
  int tp = 1, tp_rank = 0, pp = 1, pp_rank = 0, dp_rank = 0;
};

int64_t layers_for(int64_t mb, int64_t h) {
  const int64_t per_layer = 12 * h * h * 4;
  return std::max<int64_t>(4, ((mb << 20) + per_layer - 1) / per_layer / 4 * 4);  // a multiple of 4 stages
}

Box shard_box(const Layer& l, int64_t h, const Mesh& m) {
  Box b{{0, 0}, {l.rows_mult * h, l.cols_mult * h}};
  b.length[static_cast<size_t>(l.split_axis)] /= m.tp;
  b.offset[static_cast<size_t>(l.split_axis)] = b.length[static_cast<size_t>(l.split_axis)] * m.tp_rank;
  return b;
}

bool holds_layer(int64_t layer, int64_t layers, const Mesh& m) { return layer * m.pp / layers == m.pp_rank; }

// The state dict of mesh `m` (nullopt: none on this rank), filled from a
// rank-independent function of the global position, or zeros.
StateDict state(const std::optional<Mesh>& m, int64_t layers, int64_t h, bool values) {
  StateDict sd = Value::dict();
  if (!m) return sd;
  for (int64_t l = 0; l < layers; ++l) {
    if (!holds_layer(l, layers, *m)) continue;
    for (const Layer& layer : kLayer) {
      const Box b = shard_box(layer, h, *m);
      const std::string key = fmt::format("decoder.layers.{}.{}", l, layer.name);
      at::Tensor t = values ? at::arange(b.offset[0], b.offset[0] + b.length[0], at::kFloat)
                                  .unsqueeze(1)
                                  .mul(7)
                                  .add(at::arange(b.offset[1], b.offset[1] + b.length[1], at::kFloat))
                                  .add(static_cast<double>(l))
                                  .contiguous()
                            : at::zeros({b.length[0], b.length[1]});
      sd[key] = ShardedTensor::from_rank_offsets(key, t, {{layer.split_axis, m->tp_rank, m->tp}}, {m->dp_rank});
    }
  }
  return sd;
}

// Bytes the destinations need that their own sources do not hold.
uint64_t needed_from_others(const std::optional<Mesh>& src, const std::optional<Mesh>& dst, int64_t layers, int64_t h) {
  uint64_t bytes = 0;
  if (!dst) return 0;
  for (int64_t l = 0; l < layers; ++l) {
    for (const Layer& layer : kLayer) {
      const Box want = shard_box(layer, h, *dst);
      uint64_t own = 0;
      if (src && holds_layer(l, layers, *src)) {
        if (const auto cut = intersect(want, shard_box(layer, h, *src))) own = static_cast<uint64_t>(cut->numel());
      }
      bytes += (static_cast<uint64_t>(want.numel()) - own) * 4;
    }
  }
  return bytes;
}

uint64_t status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + std::strlen(field), nullptr, 10);
  }
  return 0;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

uint64_t sum(Communicator& comm, uint64_t v) {
  uint64_t total = 0;
  for (const std::string& s : comm.all_gather_bytes(std::to_string(v))) total += std::stoull(s);
  return total;
}

double max_of(Communicator& comm, double v) {
  double m = 0;
  for (const std::string& s : comm.all_gather_bytes(fmt::format("{:.9f}", v))) m = std::max(m, std::stod(s));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt transfer between meshes vs a save plus a load through local disk"};
  int64_t total_mb = 1024, hidden = 1024;
  int reps = 3, dest_ranks = 2;
  uint64_t bucket_mb = 64;
  std::string dir = "bench-tmp", scenario = "reshard", exchange = "auto";
  app.add_option("--mb", total_mb, "global state size in MiB");
  app.add_option("--hidden", hidden, "hidden size of the layers");
  app.add_option("--reps", reps, "repetitions per figure (median reported)");
  app.add_option("--scenario", scenario, "reshard or separate");
  app.add_option("--dest-ranks", dest_ranks, "separate: ranks that receive (tp over them)");
  app.add_option("--bucket-mb", bucket_mb, "TransferOptions::bucket_bytes in MiB");
  app.add_option("--dir", dir, "scratch directory for the save plus load");
  app.add_option("--exchange", exchange, "auto (shared memory within a host) or broadcast (messages)");
  bool direct_reads = true;
  app.add_option("--direct-reads", direct_reads, "auto: read other ranks' sources out of their memory (true/false)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  std::shared_ptr<Communicator> inner = communicator_from_env();
  testing::CommCounts counts;
  testing::CountingCommunicator comm(*inner, counts);
  const int rank = comm.rank(), world = comm.size();
  const int64_t layers = layers_for(total_mb, hidden);
  std::optional<Mesh> src, dst;
  if (scenario == "reshard") {
    if (world % 4 != 0) throw UsageError("reshard needs a multiple of 4 ranks");
    src = Mesh{2, rank % 2, 2, (rank / 2) % 2, rank / 4};
    dst = Mesh{4, rank % 4, 1, 0, rank / 4};
  } else if (scenario == "separate") {
    if (world < 4 + dest_ranks) throw UsageError("separate needs 4 + --dest-ranks ranks");
    if (rank < 4) src = Mesh{2, rank % 2, 2, rank / 2, 0};
    if (rank >= 4 && rank < 4 + dest_ranks) dst = Mesh{dest_ranks, rank - 4, 1, 0, 0};
  } else {
    throw UsageError("--scenario is reshard or separate");
  }
  const StateDict sources = state(src, layers, hidden, true);
  const StateDict requests = state(dst, layers, hidden, false);  // allocated and touched: a receiver's parameters
  const StateDict expected = state(dst, layers, hidden, true);
  if (rank == 0) {
    io::remove_tree(dir);
    io::make_dirs(dir);
  }

  TransferOptions options;
  options.bucket_bytes = bucket_mb << 20;
  options.exchange = parse_load_exchange(exchange);
  options.direct_reads = direct_reads;
  options.plan_cache = TransferPlanCache::create();
  bench::Timer first(comm), cached(comm), unverified(comm), baseline(comm);
  TransferResult last;
  const uint64_t rss_before = status_kb("VmRSS:");
  reset_peak_rss();
  first.run([&] { last = transfer(sources, requests, comm, options); });
  const uint64_t added_kb = status_kb("VmHWM:") - rss_before;
  // Every value arrived (the digests agreed too, or transfer threw).
  for (const auto& [key, want] : expected.as_dict()) {
    if (!at::equal(last.state_dict.at(key).as_tensor(), want.as_sharded_tensor().data)) {
      throw Error(fmt::format("rank {}: '{}' arrived different", rank, key));
    }
  }
  uint64_t sent = 0, messages = 0, direct = 0;
  double planning = 0, moving = 0, verifying = 0;
  for (int i = 0; i < reps; ++i) {
    const uint64_t bytes_before = counts.message_bytes, messages_before = counts.messages;
    cached.run([&] { last = transfer(sources, requests, comm, options); });
    sent = counts.message_bytes - bytes_before;
    messages = counts.messages - messages_before;
    direct = last.bytes_read_directly;
    planning = std::max(planning, last.planning_seconds);
    moving = last.moving_seconds;
    verifying = last.verifying_seconds;
  }
  options.verify = false;
  for (int i = 0; i < reps; ++i) unverified.run([&] { transfer(sources, requests, comm, options); });
  // The floor: each rank copies the bytes it needs from others once, within its own memory (what a transfer
  // that read straight out of the senders' memory would cost at least; shared memory costs two copies).
  bench::Timer floor(comm);
  {
    const auto bytes = static_cast<int64_t>(needed_from_others(src, dst, layers, hidden));
    at::Tensor from = at::ones({std::max<int64_t>(bytes, 1)}, at::kByte), to = at::zeros_like(from);
    for (int i = 0; i < reps; ++i) floor.run([&] { to.copy_(from); });
  }
  LoadOptions load_options;
  for (int i = 0; i < reps; ++i) {
    const std::string ckpt = fmt::format("{}/ckpt{}", dir, i);
    baseline.run([&] {
      save(sources, ckpt, comm);
      load(requests, ckpt, comm, load_options);
    });
  }

  const uint64_t needed = sum(comm, needed_from_others(src, dst, layers, hidden));
  const uint64_t sent_all = sum(comm, sent), messages_all = sum(comm, messages), direct_all = sum(comm, direct);
  const double planning_max = max_of(comm, planning), moving_max = max_of(comm, moving),
               verifying_max = max_of(comm, verifying);
  const double added_mb_max = max_of(comm, static_cast<double>(added_kb) / 1024.0);
  const uint64_t state_bytes = static_cast<uint64_t>(layers) * 12 * hidden * hidden * 4;
  if (rank == 0) {
    io::remove_tree(dir);
    const double gb = static_cast<double>(state_bytes) / 1e9;
    fmt::print(
        "scenario {} ranks {} state {:.2f} GB ({} layers, hidden {}), exchange {}{}, bucket {} MiB, {} reps "
        "(medians)\n",
        scenario, world, gb, layers, hidden, exchange,
        exchange == "auto" ? (direct_reads ? " (direct reads)" : " (shared memory only)") : "", bucket_mb, reps);
    fmt::print("transfer, plan cached, verified   {:8.3f} s   {:6.2f} GB/s of state\n", cached.median(),
               gb / cached.median());
    fmt::print("transfer, plan cached, unverified {:8.3f} s   ratio {:.2f}x\n", unverified.median(),
               baseline.median() / unverified.median());
    fmt::print("transfer, first (plans)           {:8.3f} s\n", first.median());
    fmt::print("save + load through {:14} {:8.3f} s   ratio {:.2f}x\n", dir, baseline.median(),
               baseline.median() / cached.median());
    fmt::print("floor: each rank copies what it needs once, in its own memory {:8.3f} s\n", floor.median());
    fmt::print(
        "cached transfer, slowest rank: planning {:.4f} s ({:.2f}% of the transfer), moving {:.3f} s, "
        "verifying {:.3f} s\n",
        planning_max, 100.0 * planning_max / cached.median(), moving_max, verifying_max);
    fmt::print(
        "bytes sent point to point {} in {} messages (status words {}), read directly out of other ranks' memory "
        "{}, needed from other ranks {}: sent - status + read directly = needed {}\n",
        sent_all, messages_all, messages_all * 8, direct_all, needed,
        sent_all - messages_all * 8 + direct_all == needed);
    fmt::print("peak RSS added by the first transfer, slowest rank: {:.1f} MiB (bucket {} MiB)\n", added_mb_max,
               bucket_mb);
  }
  return 0;
}
