// The open format against raw disk work on the same bytes, in the same run:
//   save as safetensors   every rank writes its rows into the consolidated
//                         files  vs  each rank writes its bytes to its own
//                         file (64 MiB pwrites) + fsync
//   export                convert_to_safetensors of a distckpt checkpoint
//                         (one process)  vs  one process reading the
//                         checkpoint's data files and writing their bytes to
//                         one new file in 32 MiB windows + fsync
//   load from safetensors each rank loads its rows, then a column split,
//                         straight from the Hugging Face files  vs  each rank
//                         preading the same number of bytes into tensors
// Every read starts from files evicted from the page cache; each pair of a
// measurement and its baseline runs in alternating order, every write after
// a pause. The export's memory: its buffers (ConvertReport::peak_buffer),
// and the peak resident set of a `distckpt convert` process against that of
// `distckpt inspect` on the same checkpoint, next to the largest tensor.
// Run standalone (1 rank) or under distckpt-launch -n N; medians of --reps.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "bench_files.h"
#include "bench_model.h"
#include "bench_timer.h"
#include "distckpt/distckpt.h"

namespace {

using namespace distckpt;
using namespace bench;

constexpr uint64_t kWindow = uint64_t{32} << 20;

// The peak resident set of `command` (run under /usr/bin/time), in bytes.
uint64_t peak_rss_of(const std::string& command) {
  FILE* out = ::popen(("/usr/bin/time -f '%M' " + command + " 2>&1 >/dev/null").c_str(), "r");
  if (!out) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, out)) kib = std::strtoull(line, nullptr, 10);
  ::pclose(out);
  return kib << 10;
}

// The directory of this program (the CLI is built beside it).
std::string bin_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path().string(); }

void write_own_file(const Model& m, const std::string& path) {
  io::File f(path, io::File::Mode::kCreateTruncate);
  uint64_t at = 0;
  for (const auto& [key, t] : m.local) {
    f.pwrite_all(t.data_ptr(), t.nbytes(), at);
    at += t.nbytes();
  }
  f.sync();
}

// The export's baseline: every data file of `ckpt`, read and written to one
// new file in windows, then fsync.
uint64_t copy_data_files(const std::string& ckpt, const std::string& out) {
  std::vector<uint8_t> window(kWindow);
  io::File dst(out, io::File::Mode::kCreateTruncate);
  uint64_t at = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ckpt + "/data")) {
    io::File src(entry.path().string(), io::File::Mode::kRead);
    for (uint64_t off = 0; off < src.size(); off += kWindow) {
      const uint64_t n = std::min<uint64_t>(kWindow, src.size() - off);
      src.pread_all(window.data(), n, off);
      dst.pwrite_all(window.data(), n, at);
      at += n;
    }
  }
  dst.sync();
  return at;
}

// The load's baseline: this rank's bytes of its own file into tensors.
void read_own_file(const std::string& path, const std::vector<at::Tensor>& dest) {
  io::File f(path, io::File::Mode::kRead);
  uint64_t at = 0;
  for (const at::Tensor& t : dest) {
    for (uint64_t off = 0; off < t.nbytes(); off += kWindow) {
      const uint64_t n = std::min<uint64_t>(kWindow, t.nbytes() - off);
      f.pread_all(static_cast<uint8_t*>(t.data_ptr()) + off, n, at + off);
    }
    at += t.nbytes();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt's open format (safetensors) vs raw reads and writes of the same bytes"};
  int64_t total_mb = 1024, hidden = 1024, vocab = 65536;
  int reps = 3;
  double settle_s = 5;
  std::string dir = "bench-open";
  app.add_option("--mb", total_mb, "global state size in MiB");
  app.add_option("--hidden", hidden, "hidden size of the GPT-like layers");
  app.add_option("--vocab", vocab, "rows of the embedding (a multiple of the rank count)");
  app.add_option("--reps", reps, "repetitions (the median is reported)");
  app.add_option("--settle", settle_s, "seconds of pause before each timed write");
  app.add_option("--dir", dir, "scratch directory (removed at the end)");
  CLI11_PARSE(app, argc, argv);

  const std::shared_ptr<Communicator> comm =
      std::getenv("WORLD_SIZE") ? communicator_from_env() : make_single_process_communicator();
  const int rank = comm->rank(), world = comm->size();
  Model model = make_model(total_mb, hidden, world);
  // A vocabulary-sized embedding: the one tensor larger than the export's window.
  const at::Tensor embedding = at::rand({vocab / world, hidden});
  model.local.emplace_back("embedding.word_embeddings.weight", embedding);
  model.local_bytes += embedding.nbytes();
  const std::string ckpt = dir + "/ckpt", raw = fmt::format("{}/raw-{}-", dir, rank);
  if (rank == 0) std::filesystem::create_directories(dir);
  comm->barrier();
  save(saved_layout(model, rank, world), ckpt, *comm);
  std::vector<at::Tensor> raw_dest;
  for (const auto& [key, t] : model.local) raw_dest.push_back(at::zeros_like(t));
  const StateDict rows = load_layout(model, rank, world, false), columns = load_layout(model, rank, world, true);

  Timer t_raw_write(*comm), t_save(*comm), t_copy(*comm), t_export(*comm), t_raw_read(*comm), t_rows(*comm),
      t_columns(*comm);
  uint64_t export_bytes = 0, peak_buffer = 0, largest = 0;
  for (const auto& [key, t] : model.local) largest = std::max<uint64_t>(largest, t.nbytes() * world);
  for (int r = 0; r < reps; ++r) {
    const std::string st = fmt::format("{}/st-{}", dir, r), exported = fmt::format("{}/export-{}", dir, r),
                      copy = fmt::format("{}/copy-{}", dir, r);
    // Each pair runs in alternating order, every write into a new file, and
    // every write starts after a pause: the virtual disk's host goes on
    // flushing for seconds after the guest's fsync returned, and bills that
    // to whatever writes next.
    SaveOptions as_safetensors;
    as_safetensors.format = StorageFormat::safetensors();
    const auto settle = [&] {
      comm->barrier();
      if (rank == 0) std::this_thread::sleep_for(std::chrono::duration<double>(settle_s));
      comm->barrier();
    };
    const auto raw_write = [&] {
      settle();
      t_raw_write.run([&] { write_own_file(model, raw + std::to_string(r)); });
    };
    const auto save_st = [&] {
      settle();
      t_save.run([&] { save(saved_layout(model, rank, world), st, *comm, as_safetensors); });
    };
    const auto copy_raw = [&] {
      if (rank == 0) drop_page_cache(dir);
      settle();
      t_copy.run([&] {
        if (rank == 0) copy_data_files(ckpt, copy);
      });
    };
    const auto export_st = [&] {
      if (rank == 0) drop_page_cache(dir);
      settle();
      t_export.run([&] {
        if (rank != 0) return;
        const ConvertReport report = convert_to_safetensors(ckpt, exported);
        export_bytes = report.bytes;
        peak_buffer = report.peak_buffer;
      });
    };
    if (r % 2 == 0) {
      raw_write();
      save_st();
      copy_raw();
      export_st();
    } else {
      save_st();
      raw_write();
      export_st();
      copy_raw();
    }

    if (rank == 0) drop_page_cache(dir);
    t_raw_read.run([&] { read_own_file(raw + std::to_string(r), raw_dest); });
    LoadOptions direct;
    direct.exchange = LoadExchange::kNone;
    if (rank == 0) drop_page_cache(dir);
    t_rows.run([&] { load(rows, st, *comm, direct); });
    if (rank == 0) drop_page_cache(dir);
    t_columns.run([&] { load(columns, st, *comm, direct); });
    comm->barrier();
    std::filesystem::remove(raw + std::to_string(r));
    if (rank == 0) {
      std::filesystem::remove_all(st);
      std::filesystem::remove_all(exported);
      std::filesystem::remove_all(copy);
    }
    comm->barrier();
  }
  // The export's memory as a user sees it: a fresh `distckpt convert`
  // process against the same binary only inspecting the checkpoint.
  uint64_t export_rss = 0, inspect_rss = 0;
  if (rank == 0) {
    const std::string cli = bin_dir() + "/distckpt";
    export_rss = peak_rss_of(cli + " convert " + ckpt + " " + dir + "/export-cli --to safetensors --quiet");
    inspect_rss = peak_rss_of(cli + " inspect " + ckpt);
    const double gb = static_cast<double>(model.local_bytes) * world / 1e9;
    auto row = [&](const char* what, const Timer& ours, const Timer& base) {
      fmt::print("| {} | {:.2f} | {:.2f} | {:.2f} |\n", what, ours.median(), base.median(),
                 ours.median() / base.median());
    };
    fmt::print("ranks {}, {:.3f} GB, median of {} repetitions\n\n", world, gb, reps);
    fmt::print("| | distckpt s | raw s | distckpt / raw |\n|---|---|---|---|\n");
    row("save as safetensors (all ranks) vs raw write + fsync", t_save, t_raw_write);
    row("export to safetensors (1 process) vs raw copy + fsync", t_export, t_copy);
    row("load rows from safetensors vs raw read", t_rows, t_raw_read);
    row("load columns from safetensors vs raw read", t_columns, t_raw_read);
    fmt::print(
        "\nexport: {} bytes; buffers {:.1f} MiB; `distckpt convert` peak RSS {:.1f} MiB, `distckpt inspect` {:.1f} "
        "MiB (difference {:.1f} MiB); largest tensor {:.1f} MiB\n",
        export_bytes, peak_buffer / 1048576.0, export_rss / 1048576.0, inspect_rss / 1048576.0,
        (static_cast<double>(export_rss) - static_cast<double>(inspect_rss)) / 1048576.0, largest / 1048576.0);
    auto samples = [](const Timer& t) {
      std::string s;
      for (double x : t.samples()) s += fmt::format(" {:.2f}", x);
      return s;
    };
    fmt::print("per repetition: raw write{} | save{} | copy{} | export{} | raw read{} | rows{} | columns{}\n",
               samples(t_raw_write), samples(t_save), samples(t_copy), samples(t_export), samples(t_raw_read),
               samples(t_rows), samples(t_columns));
    std::filesystem::remove_all(dir);
  }
  comm->barrier();
  return 0;
}
