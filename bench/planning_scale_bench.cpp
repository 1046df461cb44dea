// Planning cost at scale, by simulation (no processes): the coordinator's
// work for a save of a model of --tensors tensors on a tp x pp x dp mesh,
// run with the runtime's own code on synthetic rank plans:
//   planning  decode every rank's plan (FlatBuffers) -> validate the global
//             sharding -> choose writers (balanced) -> metadata skeleton
//   metadata  decode every rank's write results -> fill the skeleton ->
//             encode metadata.fb
// Each tensor is [4096, 4096] bf16 on one pp stage, split on rows over tp and
// replicated over dp (4 MiB chunks, 1 MiB checksum blocks). tp = 8, pp = 16
// and dp = ranks / 128, so 512 ranks have dp = 4 and 4096 ranks dp = 32.
// Peak memory is the process's high-water mark over each phase
// (/proc/self/status VmHWM, reset through /proc/self/clear_refs).
#include <fmt/format.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <string>

#include "format/metadata.h"
#include "plan/global_plan.h"
#include "plan/local_plan.h"

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

plan::LocalPlan rank_plan(int rank, int64_t tensors, int64_t dp) {
  const int64_t tp = rank % kTp, pp = (rank / kTp) % kPp, dp_rank = rank / (kTp * kPp);
  (void)dp;
  plan::LocalPlan p;
  p.rank = rank;
  for (int64_t t = pp; t < tensors; t += kPp) {
    plan::ShardPlan s;
    s.key = tensor_key(t);
    s.dtype = at::kBFloat16;
    s.global_shape = {kRows, kCols};
    s.box = Box{{tp * kRows / kTp, 0}, {kRows / kTp, kCols}};
    s.replica_id = {dp_rank};
    p.tensors.push_back(std::move(s));
  }
  return p;
}

struct Figures {
  double plan_s, metadata_s;
  double plan_peak_mb, metadata_peak_mb;
  uint64_t shard_plans, chunks, metadata_bytes;
};

Figures simulate(int ranks, int64_t tensors) {
  const int64_t dp = ranks / (kTp * kPp);
  // What the coordinator receives: one encoded plan per rank (made outside the timing).
  std::vector<std::string> encoded(static_cast<size_t>(ranks));
  uint64_t shard_plans = 0;
  for (int r = 0; r < ranks; ++r) {
    const plan::LocalPlan p = rank_plan(r, tensors, dp);
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

  // Every rank's write results: offsets and 1 MiB block checksums of its chunks.
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
  t0 = Clock::now();
  std::vector<plan::WriteResults> decoded;
  decoded.reserve(results.size());
  for (size_t r = 0; r < results.size(); ++r) decoded.push_back(plan::decode_write_results(results[r], "rank"));
  const CheckpointMetadata m = plan::fill_skeleton(global, decoded);
  const std::string bytes = encode_metadata(m);
  f.metadata_s = std::chrono::duration<double>(Clock::now() - t0).count();
  f.metadata_peak_mb = static_cast<double>(status_kib("VmHWM") - base2_kib) / 1024;
  f.metadata_bytes = bytes.size();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt planning cost at scale (simulated ranks, no processes)"};
  std::vector<int> ranks{512, 1024, 2048, 4096};
  int64_t tensors = 10000;
  app.add_option("--ranks", ranks, "simulated world sizes (multiples of 128)");
  app.add_option("--tensors", tensors, "tensors in the model");
  CLI11_PARSE(app, argc, argv);

  fmt::print("tensors {}  mesh tp={} pp={} dp=ranks/128  (balanced writers)\n", tensors, kTp, kPp);
  fmt::print(
      "| ranks | shard plans | chunks written | planning s | planning peak MB | metadata s | metadata peak MB | "
      "metadata.fb MB | planning s per 1M shard plans |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const int r : ranks) {
    if (r % (kTp * kPp) != 0) {
      fmt::print(stderr, "--ranks must be multiples of {}\n", kTp * kPp);
      return 2;
    }
    const Figures f = simulate(r, tensors);
    fmt::print("| {} | {} | {} | {:.2f} | {:.0f} | {:.2f} | {:.0f} | {:.1f} | {:.2f} |\n", r, f.shard_plans, f.chunks,
               f.plan_s, f.plan_peak_mb, f.metadata_s, f.metadata_peak_mb, static_cast<double>(f.metadata_bytes) / 1e6,
               f.plan_s / (static_cast<double>(f.shard_plans) / 1e6));
  }
  return 0;
}
