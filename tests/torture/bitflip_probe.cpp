// distckpt_bitflip_probe: one rank of a job that flips single bits in copies
// of a committed checkpoint and checks that no flip goes unnoticed.
//   distckpt-launch -n 2 -- distckpt_bitflip_probe --pristine P --work W --trials N [--seed S] [--report R]
// Every trial: rank 0 copies P to W/trial and flips one random bit of one
// file (files taken in turn, so each gets its share); every rank then loads
// the whole checkpoint (its rows of every tensor, every object, the common
// state) and hashes what the load returned. Outcomes: "rejected" (the load
// threw), "harmless" (same state as loading P), "silent" (the load returned
// a different state: the failure this probe exists to find). Rank 0 also runs
// verify_checkpoint, which must reject whatever the load rejected.
// Exit 0 only with no silent trial and no rejection that verify missed.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "distckpt/distckpt.h"
#include "format/common_state.h"
#include "io/checksum.h"
#include "io/file.h"
#include "load/checkpoint_reader.h"

namespace {

using namespace distckpt;
namespace fs = std::filesystem;

// What each rank asks for, taken from the pristine checkpoint so that a flip
// in the copy cannot change the question: rows [r*n/W, (r+1)*n/W) of every
// tensor (0-d tensors whole), every object.
StateDict request(const StorageIndex& md, int rank, int world) {
  StateDict sd = Value::dict();
  for (size_t i = 0; i < md.tensors.size(); ++i) {
    const TensorRecord& t = md.tensors[i];
    Shape shape = t.global_shape, offset(shape.size(), 0);
    if (!shape.empty()) {
      const int64_t begin = shape[0] * rank / world, end = shape[0] * (rank + 1) / world;
      if (begin == end) continue;
      offset[0] = begin;
      shape[0] = end - begin;
    }
    sd[fmt::format("tensor_{}", i)] = ShardedTensor::from_global_offset(
        t.key, at::zeros(shape, at::TensorOptions().dtype(t.dtype)), t.global_shape, offset);
  }
  for (size_t i = 0; i < md.objects.size(); ++i) {
    const ObjectRecord& o = md.objects[i];
    sd[fmt::format("object_{}", i)] = ShardedObject{o.key, "", o.global_shape, o.global_offset};
  }
  return sd;
}

// The loaded state (tensors, object bytes, common values) in one hash.
uint64_t load_and_hash(const StateDict& question, const std::string& dir, Communicator& comm) {
  const LoadResult result = load(question, dir, comm);
  const std::string encoded = encode_common_state(result.state_dict);
  return io::xxh3(encoded.data(), encoded.size());
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(fs::relative(entry.path(), dir).string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void flip_bit(const std::string& path, uint64_t offset, int bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char byte = static_cast<char>(f.get() ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(byte);
  if (!f) throw Error(fmt::format("cannot flip byte {} of {}", offset, path));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"single-bit flips against load and verify"};
  std::string pristine, work, report_path;
  int trials = 100;
  uint64_t seed = 1;
  app.add_option("--pristine", pristine, "a committed checkpoint (never modified)")->required();
  app.add_option("--work", work, "scratch directory for the flipped copies")->required();
  app.add_option("--trials", trials, "number of flips");
  app.add_option("--seed", seed, "random seed (rank 0 draws the flips)");
  app.add_option("--report", report_path, "JSON lines, one per trial (rank 0)");
  CLI11_PARSE(app, argc, argv);

  const std::shared_ptr<Communicator> comm = communicator_from_env();
  const StorageIndex md = loading::CheckpointReader(pristine).index();
  const StateDict question = request(md, comm->rank(), comm->size());
  const uint64_t reference = load_and_hash(question, pristine, *comm);
  const std::vector<std::string> files = files_of(pristine);
  const std::string trial_dir = work + "/trial";

  std::mt19937_64 rng(seed);
  std::ofstream report;
  if (comm->rank() == 0 && !report_path.empty()) report.open(report_path);
  std::map<std::string, std::map<std::string, int>> by_file;  // file -> outcome -> count
  int silent = 0, verify_missed = 0;
  for (int trial = 0; trial < trials; ++trial) {
    nlohmann::json record = {{"trial", trial}};
    if (comm->rank() == 0) {
      const std::string& file = files[static_cast<size_t>(trial) % files.size()];
      fs::remove_all(trial_dir);
      fs::copy(pristine, trial_dir, fs::copy_options::recursive);
      const uint64_t size = io::file_size(trial_dir + "/" + file);
      const uint64_t offset = rng() % size;
      const int bit = static_cast<int>(rng() % 8);
      flip_bit(trial_dir + "/" + file, offset, bit);
      record["file"] = file;
      record["offset"] = offset;
      record["bit"] = bit;
    }
    comm->barrier();
    std::string outcome;
    try {
      outcome = load_and_hash(question, trial_dir, *comm) == reference ? "harmless" : "silent";
    } catch (const Error& e) {
      outcome = "rejected";
      if (comm->rank() == 0) record["error"] = e.what();
    }
    const std::vector<std::string> outcomes = comm->gather_bytes(outcome, 0);
    if (comm->rank() == 0) {
      // The trial's outcome: rejected if any rank's load failed, silent if
      // any rank got different values without an error.
      std::string overall = "harmless";
      for (const std::string& o : outcomes) {
        if (o == "silent") overall = "silent";
        if (o == "rejected" && overall != "silent") overall = "rejected";
      }
      const VerifyReport verified = verify_checkpoint(trial_dir);
      record["load"] = outcomes;
      record["outcome"] = overall;
      record["verify"] = status_name(verified.status);
      if (overall == "silent") ++silent;
      if (overall == "rejected" && verified.intact()) ++verify_missed;
      by_file[record["file"].get<std::string>()][overall]++;
      if (report.is_open()) report << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
      if (overall == "silent" || (overall == "rejected" && verified.intact())) {
        fmt::print("trial {}: {} (verify: {}) at {} byte {} bit {}\n", trial, overall, status_name(verified.status),
                   record["file"].get<std::string>(), record["offset"].get<uint64_t>(), record["bit"].get<int>());
      }
    }
    comm->barrier();
  }
  if (comm->rank() != 0) return 0;
  fs::remove_all(trial_dir);
  int rejected = 0, harmless = 0;
  fmt::print("{:<28} {:>8} {:>8} {:>8}\n", "file", "rejected", "harmless", "silent");
  for (auto& [file, counts] : by_file) {
    fmt::print("{:<28} {:>8} {:>8} {:>8}\n", file, counts["rejected"], counts["harmless"], counts["silent"]);
    rejected += counts["rejected"];
    harmless += counts["harmless"];
  }
  fmt::print("{} flips: {} rejected, {} harmless, {} silent; verify accepted {} checkpoint(s) the load rejected\n",
             trials, rejected, harmless, silent, verify_missed);
  return silent == 0 && verify_missed == 0 ? 0 : 1;
}
