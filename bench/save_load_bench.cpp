// Save/load throughput of distckpt next to baselines measured in the same run
// on the same file system with the same bytes per rank:
//   raw write          each rank writes its bytes to one file (64 MiB pwrites) + fsync,
//                      buffered and with O_DIRECT (the faster is the disk's bandwidth)
//   raw read           each rank reads that file back (read once untimed, then
//                      evicted from the page cache, like every file read here)
//                      into tensors of the model's shapes, allocated and touched
//                      like the load's destinations, and into one reused 64 MiB
//                      buffer (what the disk and the kernel deliver); and read,
//                      hashed (XXH3) and copied once more in memory: the least
//                      work of a verified reshard of the same bytes
//   torch::save / torch::load of the same tensors (+ fsync after the save)
// and, for distckpt: the synchronous save (committed), the time an
// asynchronous save keeps the caller (steady state: plan cached, staging
// buffers warm, parameters just written by an optimizer step), loads into
// existing (already touched) tensors under the same layout and resharded
// (rows -> columns). With background staging (AsyncStaging::kInBackground),
// the trainer is blocked for the call plus the wait before its optimizer step,
// after --compute-seconds of simulated forward/backward (a sleep: the copy
// gets the cores a real step would leave it); each rank times its own calls
// (no barrier after them) and the slowest rank's time is reported.
// Run standalone (1 rank) or under distckpt-launch -n N. Every figure is the
// median of --reps repetitions, timed on rank 0 between barriers;
// --loads-only saves once and times only the reads; --from DIR times the
// loads of a checkpoint of the same state written by another program
// (PyTorch DCP's, bench/dcp_native_load.sh) instead.
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bench_files.h"
#include "bench_model.h"
#include "bench_timer.h"
#include "distckpt/distckpt.h"
#include "io/checksum.h"
#include "io/file.h"

namespace {

using namespace distckpt;
using namespace bench;

// The baseline: one file per rank, 64 MiB sequential writes, then fsync.
// Buffered writes go straight from the tensors; O_DIRECT ones need an
// aligned buffer, so they copy each 64 MiB into one first.
void raw_write(const Model& m, const std::string& path, bool direct, uint8_t* aligned, uint64_t buffer_bytes) {
  io::File f(path, io::File::Mode::kCreateTruncate);
  if (direct) f.try_enable_direct();
  uint64_t at = 0;
  for (const auto& [k, t] : m.local) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    for (uint64_t off = 0; off < t.nbytes(); off += buffer_bytes) {
      const uint64_t n = std::min<uint64_t>(buffer_bytes, t.nbytes() - off);
      if (!direct) {
        f.pwrite_all(p + off, n, at);
        at += n;
        continue;
      }
      std::memcpy(aligned, p + off, n);
      const uint64_t padded = (n + 4095) / 4096 * 4096;
      f.pwrite_all(aligned, padded, at);
      at += padded;
    }
  }
  f.sync();
}

// Reads the raw file back into `dest` (one tensor per model tensor, in the
// order raw_write wrote them) in 64 MiB preads.
void raw_read_into(const std::string& path, const std::vector<at::Tensor>& dest, uint64_t piece_bytes) {
  io::File f(path, io::File::Mode::kRead);
  uint64_t at = 0;
  for (const at::Tensor& t : dest) {
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (uint64_t off = 0; off < t.nbytes(); off += piece_bytes) {
      const uint64_t n = std::min<uint64_t>(piece_bytes, t.nbytes() - off);
      f.pread_all(p + off, n, at);
      at += (n + 4095) / 4096 * 4096;  // raw_write's O_DIRECT padding
    }
  }
}

// The least a verified reshard does with the same bytes: read them (64 MiB
// preads, as above), compute the XXH3 of every 1 MiB checksum block, and copy
// them once more in memory into `dest`, as a part cut out of a stored chunk
// must be (out of a slab in this process or another's shared memory).
void raw_read_verify_copy(const std::string& path, const std::vector<at::Tensor>& dest, uint64_t piece_bytes) {
  io::File f(path, io::File::Mode::kRead);
  std::vector<uint8_t> buffer(piece_bytes);
  uint64_t at = 0, sum = 0;
  for (const at::Tensor& t : dest) {
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (uint64_t off = 0; off < t.nbytes(); off += piece_bytes) {
      const uint64_t n = std::min<uint64_t>(piece_bytes, t.nbytes() - off);
      f.pread_all(buffer.data(), n, at);
      for (uint64_t b = 0; b < n; b += 1 << 20) sum += io::xxh3(buffer.data() + b, std::min<uint64_t>(1 << 20, n - b));
      std::memcpy(p + off, buffer.data(), n);
      at += (n + 4095) / 4096 * 4096;
    }
  }
  if (sum == 42) fmt::print("");  // keeps the hashes
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt save/load throughput vs raw disk bandwidth and torch::save"};
  int64_t total_mb = 512, hidden = 1024;
  int reps = 3;
  double compute_seconds = 1.0;
  std::string dir = "bench-tmp", exchange = "auto";
  app.add_option("--mb", total_mb, "global state size in MiB");
  app.add_option("--hidden", hidden, "hidden size of the GPT-like layers");
  app.add_option("--reps", reps, "repetitions per figure (median reported)");
  app.add_option("--compute-seconds", compute_seconds,
                 "simulated forward/backward between a background-staged save "
                 "and the wait before the optimizer step");
  app.add_option("--dir", dir, "scratch directory on the file system to measure");
  app.add_option("--exchange", exchange, "load exchange: auto, none, broadcast, all_gather");
  int io_threads = 0;
  bool no_verify = false, loads_only = false;
  std::string from;
  app.add_option("--from", from,
                 "load this checkpoint of the same state (e.g. PyTorch DCP's, bench/dcp_baseline.py --keep) instead of "
                 "saving one; implies --loads-only");
  app.add_flag("--loads-only", loads_only, "save once, then time only the reads (raw, distckpt loads)");
  app.add_option("--io-threads", io_threads,
                 "reader/writer threads per rank (0: this host's cores shared by its ranks)");
  app.add_flag("--no-verify", no_verify, "loads skip checksum verification");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  std::shared_ptr<Communicator> comm =
      std::getenv("WORLD_SIZE") ? communicator_from_env() : make_single_process_communicator();
  const int rank = comm->rank(), world = comm->size();
  const Model model = make_model(total_mb, hidden, world);
  const std::string raw = fmt::format("{}/raw_{}.bin", dir, rank);
  const std::string torch_file = fmt::format("{}/torch_{}.pt", dir, rank);
  const std::string ckpt = dir + "/ckpt", async_ckpt = dir + "/async";
  if (rank == 0) {
    io::remove_tree(dir);
    io::make_dirs(dir);
  }
  comm->barrier();

  bench::RankTimer dc_bg_call(*comm), dc_bg_wait(*comm);
  bench::Timer raw_buffered(*comm), raw_direct(*comm), raw_read(*comm), raw_into(*comm), raw_floor(*comm),
      dc_save(*comm), dc_async(*comm), dc_load(*comm), dc_reshard(*comm), t_save(*comm), t_load(*comm);
  bench::DiskWatch disk_raw(dir), disk_floor(dir), disk_load(dir), disk_reshard(dir);  // the reads' device activity
  constexpr uint64_t kBuffer = uint64_t{64} << 20;
  std::vector<uint8_t> buffer(kBuffer);
  void* aligned_memory = nullptr;
  if (posix_memalign(&aligned_memory, 4096, kBuffer) != 0) return 1;
  std::unique_ptr<uint8_t, decltype(&std::free)> aligned(static_cast<uint8_t*>(aligned_memory), &std::free);
  std::memset(aligned.get(), 0, kBuffer);
  std::vector<at::Tensor> tensors, raw_dest;
  for (const auto& [k, t] : model.local) {
    tensors.push_back(t);
    raw_dest.push_back(at::zeros_like(t));  // allocated and touched like the load's destinations
  }
  const StateDict same = load_layout(model, rank, world, false), columns = load_layout(model, rank, world, true);
  LoadOptions load_options;
  load_options.exchange = parse_load_exchange(exchange);
  load_options.io_threads = io_threads;
  load_options.verify_checksums = !no_verify;
  SaveOptions save_options;
  save_options.io_threads = io_threads;
  AsyncCallsQueue queue(*comm);
  AsyncQueueOptions background;
  background.staging = AsyncStaging::kInBackground;
  AsyncCallsQueue bg_queue(*comm, background);
  auto clear = [&](const std::string& path) {
    if (rank == 0) io::remove_tree(path);
    comm->barrier();
  };
  // Warm-up of the asynchronous path (a training loop's steady state): plans
  // once, and the staging pool settles on the buffers it keeps.
  for (int warm = 0; warm < 2; ++warm) {
    clear(async_ckpt);
    queue.save(saved_layout(model, rank, world), async_ckpt, save_options);
    queue.maybe_finalize(true);
    clear(async_ckpt);
    bg_queue.save(saved_layout(model, rank, world), async_ckpt, save_options);
    bg_queue.maybe_finalize(true);
  }

  if (!from.empty()) loads_only = true;
  if (loads_only) {
    raw_write(model, raw, true, aligned.get(), kBuffer);
    if (from.empty()) save(saved_layout(model, rank, world), ckpt, *comm, save_options);
  }
  const std::string loaded = from.empty() ? ckpt : from;
  for (int rep = 0; rep < reps; ++rep) {
    if (!loads_only) {
      raw_buffered.run([&] { raw_write(model, raw, false, aligned.get(), kBuffer); });
      raw_direct.run([&] { raw_write(model, raw, true, aligned.get(), kBuffer); });
      clear(ckpt);
      dc_save.run([&] { save(saved_layout(model, rank, world), ckpt, *comm, save_options); });
      clear(async_ckpt);
      // A training loop checkpoints right after an optimizer step, which
      // wrote every parameter: the copy reads memory in that state.
      for (const at::Tensor& t : tensors) t.mul_(1.0f);
      dc_async.run([&] { queue.save(saved_layout(model, rank, world), async_ckpt, save_options); });
      queue.maybe_finalize(true);
      clear(async_ckpt);
      for (const at::Tensor& t : tensors) t.mul_(1.0f);
      comm->barrier();
      const double call =
          dc_bg_call.time([&] { bg_queue.save(saved_layout(model, rank, world), async_ckpt, save_options); });
      std::this_thread::sleep_for(std::chrono::duration<double>(compute_seconds));
      const double wait = dc_bg_wait.time([&] { bg_queue.wait_staged(); });
      dc_bg_call.record(call);
      dc_bg_wait.record(wait);
      bg_queue.maybe_finalize(true);
      t_save.run([&] {
        torch::save(tensors, torch_file);
        fsync_path(torch_file);
      });
    }
    prime(raw);
    prime(torch_file);
    if (rank == 0) prime(loaded);
    comm->barrier();
    auto cold = [&] {  // every rank's files leave the page cache
      comm->barrier();
      if (rank == 0) drop_page_cache(dir);
      comm->barrier();
    };
    cold();
    raw_read.run([&] {
      io::File f(raw, io::File::Mode::kRead);
      const uint64_t n = f.size();
      for (uint64_t off = 0; off < n; off += buffer.size()) {
        f.pread_all(buffer.data(), std::min<uint64_t>(buffer.size(), n - off), off);
      }
    });
    cold();
    raw_into.run([&] { raw_read_into(raw, raw_dest, kBuffer); }, &disk_raw);
    cold();
    raw_floor.run([&] { raw_read_verify_copy(raw, raw_dest, kBuffer); }, &disk_floor);
    cold();
    dc_load.run([&] { load(same, loaded, *comm, load_options); }, &disk_load);
    cold();
    dc_reshard.run([&] { load(columns, loaded, *comm, load_options); }, &disk_reshard);
    if (loads_only) continue;
    cold();
    t_load.run([&] {
      std::vector<at::Tensor> loaded;
      torch::load(loaded, torch_file);
    });
  }
  queue.close();
  bg_queue.close();

  const double gb = static_cast<double>(model.local_bytes) * world / 1e9;
  if (rank == 0) {
    const double wb = raw_buffered.median(), wd = raw_direct.median(), w = std::min(wb, wd);
    const double rb = raw_read.median(), r = raw_into.median();
    const double s = dc_save.median(), a = dc_async.median(), l = dc_load.median(), x = dc_reshard.median();
    const double ts = t_save.median(), tl = t_load.median();
    const double bg = dc_bg_call.median() + dc_bg_wait.median();
    fmt::print("ranks {}  state {:.3f} GB  ({} tensors per rank, hidden {}, median of {}, load exchange {}{})\n", world,
               gb, model.local.size(), hidden, reps, exchange,
               from.empty() ? "" : fmt::format(", loading {} ({})", from, detect_storage_format(from).name()));
    fmt::print("| operation | seconds | GB/s | vs baseline |\n|---|---|---|---|\n");
    if (!loads_only) {
      fmt::print("| raw write + fsync, buffered | {:.3f} | {:.2f} | |\n", wb, gb / wb);
      fmt::print("| raw write + fsync, O_DIRECT | {:.3f} | {:.2f} | |\n", wd, gb / wd);
      fmt::print("| distckpt save (committed) | {:.3f} | {:.2f} | {:.2f}x best raw write |\n", s, gb / s, w / s);
      fmt::print("| distckpt async save, caller blocked | {:.3f} | | {:.1f}% of the sync save |\n", a, 100 * a / s);
      fmt::print(
          "| distckpt async save, background staging: call {:.3f} + wait after {:.1f} s compute {:.3f} | {:.3f} | | "
          "{:.1f}% of the sync save |\n",
          dc_bg_call.median(), compute_seconds, dc_bg_wait.median(), bg, 100 * bg / s);
      fmt::print("| torch::save + fsync | {:.3f} | {:.2f} | {:.2f}x best raw write |\n", ts, gb / ts, w / ts);
    }
    fmt::print("| raw read into one 64 MiB buffer | {:.3f} | {:.2f} | |\n", rb, gb / rb);
    fmt::print("| raw read into tensors (baseline) | {:.3f} | {:.2f} | 1.00 |\n", r, gb / r);
    const double fl = raw_floor.median();
    fmt::print("| raw read + XXH3 + one copy in memory (a verified reshard's floor) | {:.3f} | {:.2f} | {:.2f}x |\n",
               fl, gb / fl, r / fl);
    fmt::print("| distckpt load, same layout | {:.3f} | {:.2f} | {:.2f}x raw read ({:.2f}x buffer) |\n", l, gb / l,
               r / l, rb / l);
    fmt::print(
        "| distckpt load, resharded (rows -> columns) | {:.3f} | {:.2f} | {:.2f}x raw read ({:.2f}x buffer, {:.2f}x "
        "floor) |\n",
        x, gb / x, r / x, rb / x, fl / x);
    if (!loads_only) fmt::print("| torch::load | {:.3f} | {:.2f} | {:.2f}x raw read |\n", tl, gb / tl, r / tl);
    fmt::print(
        "seconds per repetition, in order: async blocked [{:.3f}]  raw read into tensors [{:.3f}]  floor [{:.3f}]  "
        "load [{:.3f}]  resharded load [{:.3f}]\n",
        fmt::join(dc_async.samples(), " "), fmt::join(raw_into.samples(), " "), fmt::join(raw_floor.samples(), " "),
        fmt::join(dc_load.samples(), " "), fmt::join(dc_reshard.samples(), " "));
    if (disk_raw.valid()) {
      auto disk = [](const bench::DiskWatch& d) {
        return fmt::format("{:.3f} GB, busy {:.0f}%", bench::median_of(d.read_gb()), 100 * bench::median_of(d.busy()));
      };
      fmt::print(
          "the disk during each read (medians: bytes the device read, share of the time it had I/O in flight): raw "
          "read into tensors {}; floor {}; load {}; resharded load {}\n",
          disk(disk_raw), disk(disk_floor), disk(disk_load), disk(disk_reshard));
    }
    fmt::print(
        "RESULT ranks={} gb={:.3f} raw_write_buffered_s={:.3f} raw_write_direct_s={:.3f} save_s={:.3f} "
        "async_blocked_s={:.3f} torch_save_s={:.3f} raw_read_buffer_s={:.3f} raw_read_s={:.3f} load_s={:.3f} "
        "reshard_load_s={:.3f} torch_load_s={:.3f} async_background_blocked_s={:.3f} raw_floor_s={:.3f}\n",
        world, gb, wb, wd, s, a, ts, rb, r, l, x, tl, bg, fl);
  }
  comm->barrier();
  if (rank == 0) io::remove_tree(dir);
  return 0;
}
