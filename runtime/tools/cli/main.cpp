// distckpt: inspect, verify and digest checkpoints from the command line.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "api/checkpoint_reader.h"
#include "distckpt/api/checkpoint.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/format/checkpoint_config.h"
#include "format/dtype.h"

namespace {

using distckpt::CheckpointMetadata;

// Keys and error texts come from untrusted files and need not be UTF-8:
// invalid bytes become U+FFFD instead of aborting the report.
std::string as_text(const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace); }

uint64_t stored_bytes(const distckpt::TensorRecord& t) {
  uint64_t n = 0;
  for (const auto& c : t.chunks) n += c.byte_length;
  return n;
}

std::vector<std::string> common_keys(const std::string& dir) {
  std::vector<std::string> keys;
  for (const auto& [path, value] : distckpt::nested_items(distckpt::load_common_state_dict(dir))) {
    keys.push_back(distckpt::to_string(path));
  }
  return keys;
}

int inspect(const std::string& dir, bool as_json) {
  const distckpt::api::CheckpointReader reader(dir, false);
  const CheckpointMetadata& md = reader.metadata();
  const std::vector<std::string> common = common_keys(dir);
  if (as_json) {
    nlohmann::json j;
    j["dir"] = dir;
    j["format_version"] = md.format_version;
    j["world_size"] = md.world_size;
    j["layout"] = {{"name", md.layout_name}, {"fingerprint", md.layout_fingerprint}};
    j["tensors"] = nlohmann::json::array();
    for (const auto& t : md.tensors) {
      j["tensors"].push_back({{"key", t.key},
                              {"dtype", distckpt::dtype_name(t.dtype)},
                              {"shape", t.global_shape},
                              {"chunks", t.chunks.size()},
                              {"bytes", stored_bytes(t)}});
    }
    j["objects"] = nlohmann::json::array();
    for (const auto& o : md.objects) {
      j["objects"].push_back({{"key", o.key}, {"unique_key", o.unique_key()}, {"bytes", o.byte_length}});
    }
    j["common_keys"] = common;
    std::cout << as_text(j) << '\n';
    return 0;
  }
  uint64_t total = 0;
  for (const auto& t : md.tensors) total += stored_bytes(t);
  fmt::print("checkpoint {}\n  format version {}, saved by {} ranks, {} files, {} tensors ({} bytes), {} objects\n",
             dir, md.format_version, md.world_size, md.files.size(), md.tensors.size(), total, md.objects.size());
  if (!md.layout_name.empty()) fmt::print("  layout {} ({})\n", md.layout_name, md.layout_fingerprint);
  fmt::print("\ntensors:\n  {:<48} {:<9} {:<20} {:>6} {:>14}\n", "key", "dtype", "shape", "chunks", "bytes");
  for (const auto& t : md.tensors) {
    fmt::print("  {:<48} {:<9} {:<20} {:>6} {:>14}\n", t.key, distckpt::dtype_name(t.dtype),
               distckpt::to_string(t.global_shape), t.chunks.size(), stored_bytes(t));
  }
  fmt::print("\nobjects:\n");
  for (const auto& o : md.objects) fmt::print("  {} ({} bytes)\n", o.unique_key(), o.byte_length);
  fmt::print("\ncommon keys:\n");
  for (const auto& k : common) fmt::print("  {}\n", k);
  return 0;
}

const char* status_name(distckpt::VerifyReport::Status status) {
  switch (status) {
    case distckpt::VerifyReport::Status::kIntact:
      return "intact";
    case distckpt::VerifyReport::Status::kCorrupt:
      return "corrupt";
    case distckpt::VerifyReport::Status::kNotACheckpoint:
      return "not_a_checkpoint";
  }
  return "unknown";
}

// Exit codes: 0 intact, 1 corrupt or incomplete, 2 not a checkpoint (and
// usage errors, from main).
int verify(const std::string& dir, bool as_json) {
  // Progress only for a person watching: a terminal, and not in --json mode.
  distckpt::VerifyProgress progress;
  if (!as_json && isatty(STDERR_FILENO)) {
    progress = [&](uint64_t done, uint64_t total) {
      const double percent = total == 0 ? 100.0 : 100.0 * static_cast<double>(done) / static_cast<double>(total);
      fmt::print(stderr, "\rverifying {}: {:.1f} of {:.1f} MiB ({:.0f}%)", dir, done / 1048576.0, total / 1048576.0,
                 percent);
      if (done == total) fmt::print(stderr, "\n");
    };
  }
  const distckpt::VerifyReport report = distckpt::verify_checkpoint(dir, progress);
  const int code = report.intact() ? 0 : report.status == distckpt::VerifyReport::Status::kCorrupt ? 1 : 2;
  if (as_json) {
    const nlohmann::json j = {{"dir", dir},
                              {"status", status_name(report.status)},
                              {"exit_code", code},
                              {"format_version", report.format_version},
                              {"files", report.files},
                              {"bytes_checked", report.bytes_checked},
                              {"blocks_checked", report.blocks_checked},
                              {"problems", report.problems}};
    std::cout << as_text(j) << '\n';
    return code;
  }
  for (const auto& p : report.problems) fmt::print(stderr, "{}\n", p);
  if (report.intact()) {
    fmt::print("{}: intact (format version {}, {} files, {} bytes in {} blocks, every checksum matches)\n", dir,
               report.format_version, report.files, report.bytes_checked, report.blocks_checked);
  } else if (code == 1) {
    fmt::print(stderr, "{}: CORRUPT, {} problem(s) found; do not load it\n", dir, report.problems.size());
  } else {
    fmt::print(stderr, "{}: not a distckpt checkpoint\n", dir);
  }
  return code;
}

int digest(const std::string& dir) {
  for (const auto& d : distckpt::digest_checkpoint(dir)) fmt::print("{}\n", d.line());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt: inspect, verify and digest distributed checkpoints"};
  app.require_subcommand(1);
  std::string dir;
  bool as_json = false;
  auto* inspect_cmd = app.add_subcommand("inspect", "list tensors, objects and common keys");
  inspect_cmd->add_option("dir", dir, "checkpoint directory")->required();
  inspect_cmd->add_flag("--json", as_json, "machine-readable output");
  auto* verify_cmd = app.add_subcommand(
      "verify", "check everything a load would; exit 0 intact, 1 corrupt or incomplete, 2 not a checkpoint");
  verify_cmd->add_option("dir", dir, "checkpoint directory")->required();
  verify_cmd->add_flag("--json", as_json, "machine-readable report");
  auto* digest_cmd = app.add_subcommand("digest", "one line per tensor: KEY DTYPE SHAPE HASH (layout-independent)");
  digest_cmd->add_option("dir", dir, "checkpoint directory")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; usage errors share verify's "not a checkpoint" code 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*inspect_cmd) return inspect(dir, as_json);
    if (*verify_cmd) return verify(dir, as_json);
    return digest(dir);
  } catch (const distckpt::Error& e) {
    fmt::print(stderr, "distckpt: {}\n", e.what());
    return 2;
  }
}
