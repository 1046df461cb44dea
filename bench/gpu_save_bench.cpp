// Saving from GPU memory against its two bounds, measured in the same run:
//
//   device -> pinned host   the bytes copied into page-locked host memory
//   raw write + fsync       the same bytes written to one file from host memory
//   distckpt save           the CUDA tensors saved (committed, fsync'd)
//
// The goal (docs/GPU.md): the save at >= 0.9x the smaller of the two bounds.
// One process, one GPU; medians of --reps repetitions. Without a visible GPU
// (or a LibTorch without CUDA) it says so and measures nothing.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_files.h"
#include "bench_timer.h"
#include "core/device_event.h"
#include "distckpt/distckpt.h"
#include "io/file.h"

namespace {

using namespace distckpt;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Save from GPU memory against the device-to-host and disk bounds"};
  int64_t mb = 1024, tensors = 16, reps = 5;
  std::string dir = "/tmp/distckpt-gpu-bench";
  app.add_option("--mb", mb, "MiB of CUDA tensors saved");
  app.add_option("--tensors", tensors, "how many tensors they are cut into");
  app.add_option("--reps", reps, "repetitions (the median is reported)");
  app.add_option("--dir", dir, "scratch directory (removed at the end)");
  CLI11_PARSE(app, argc, argv);
  if (!torch::cuda::is_available()) {
    fmt::print("gpu_save_bench: no GPU visible, or LibTorch without CUDA: nothing measured\n");
    return 0;
  }
  const at::Device device(at::kCUDA, 0);
  const int64_t elements = mb * (int64_t{1} << 20) / 4 / tensors;
  StateDict sd;
  std::vector<at::Tensor> on_device;
  for (int64_t i = 0; i < tensors; ++i) {
    on_device.push_back(at::rand({elements}, at::TensorOptions().device(device)));
    sd[fmt::format("t{}", i)] = Value(ShardedTensor::from_rank_offsets(fmt::format("t{}", i), on_device.back(), {}));
  }
  const double gb = static_cast<double>(mb) / 1024.0 * 1.073741824;
  auto comm = make_single_process_communicator();
  std::filesystem::create_directories(dir);
  std::vector<at::Tensor> pinned;
  for (const at::Tensor& t : on_device) {
    pinned.push_back(at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).pinned_memory(true)));
  }

  std::vector<double> d2h, raw, saved;
  for (int64_t rep = 0; rep < reps; ++rep) {
    // Device -> pinned host: every tensor, one stream, waited for once.
    DeviceEvent copied(device);
    auto t0 = Clock::now();
    for (size_t i = 0; i < on_device.size(); ++i) pinned[i].copy_(on_device[i], /*non_blocking=*/true);
    copied.record(current_stream(device));
    copied.synchronize();
    d2h.push_back(seconds_since(t0));

    // Raw write of the same bytes from pinned memory, one file, then fsync.
    const std::string raw_path = dir + "/raw";
    t0 = Clock::now();
    {
      io::File f(raw_path, io::File::Mode::kCreateTruncate);
      uint64_t at = 0;
      for (const at::Tensor& p : pinned) {
        f.pwrite_all(p.data_ptr(), p.nbytes(), at);
        at += p.nbytes();
      }
      f.sync();
    }
    raw.push_back(seconds_since(t0));
    std::filesystem::remove(raw_path);

    SaveOptions options;
    options.overwrite = true;
    t0 = Clock::now();
    save(sd, dir + "/ckpt", *comm, options);
    saved.push_back(seconds_since(t0));
    bench::drop_page_cache(dir);
  }
  const double c = bench::median_of(d2h), w = bench::median_of(raw), s = bench::median_of(saved),
               bound = std::max(c, w);
  fmt::print("| {} CUDA tensors, {:.3f} GB, median of {} | s | GB/s | |\n|---|---|---|---|\n", tensors, gb, reps);
  fmt::print("| device -> pinned host copy | {:.3f} | {:.2f} | |\n", c, gb / c);
  fmt::print("| raw write + fsync (from pinned memory) | {:.3f} | {:.2f} | |\n", w, gb / w);
  fmt::print("| distckpt save from GPU memory (committed) | {:.3f} | {:.2f} | {:.2f}x the smaller bound (goal 0.9) |\n",
             s, gb / s, bound / s);
  fmt::print("RESULT gb={:.3f} d2h_s={:.3f} raw_write_s={:.3f} save_s={:.3f} ratio={:.3f}\n", gb, c, w, s, bound / s);
  std::filesystem::remove_all(dir);
  return 0;
}
