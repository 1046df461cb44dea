// distckpt: inspect, verify and digest checkpoints from the command line.
#include <fmt/format.h>

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
    std::cout << j.dump(2) << '\n';
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

int verify(const std::string& dir) {
  const std::vector<std::string> problems = distckpt::verify_checkpoint(dir);
  for (const auto& p : problems) fmt::print(stderr, "{}\n", p);
  if (!problems.empty()) {
    fmt::print(stderr, "{}: {} problem(s) found\n", dir, problems.size());
    return 1;
  }
  fmt::print("{}: all checksums match\n", dir);
  return 0;
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
  auto* verify_cmd = app.add_subcommand("verify", "recompute every checksum; exit 1 on any mismatch");
  verify_cmd->add_option("dir", dir, "checkpoint directory")->required();
  auto* digest_cmd = app.add_subcommand("digest", "one line per tensor: KEY DTYPE SHAPE HASH (layout-independent)");
  digest_cmd->add_option("dir", dir, "checkpoint directory")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*inspect_cmd) return inspect(dir, as_json);
    if (*verify_cmd) return verify(dir);
    return digest(dir);
  } catch (const distckpt::Error& e) {
    fmt::print(stderr, "distckpt: {}\n", e.what());
    return 2;
  }
}
