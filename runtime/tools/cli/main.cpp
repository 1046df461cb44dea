// distckpt: inspect, verify, digest, convert, diff and manage checkpoints
// from the command line.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/api/checkpoint.h"
#include "distckpt/api/convert.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/format/checkpoint_config.h"
#include "distckpt/version.h"
#include "format/dtype.h"
#include "io/file.h"
#include "manage_commands.h"
#include "plain_values.h"
#include "storage/distckpt_storage.h"

namespace {

using distckpt::cli::plain_json;
using distckpt::cli::plain_text;
using distckpt::cli::printable;

// Keys and error texts come from untrusted files and need not be UTF-8:
// invalid bytes become U+FFFD instead of aborting the report.
std::string as_text(const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace); }

// "1 file", "2 files".
std::string count(uint64_t n, const char* noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

uint64_t stored_bytes(const distckpt::TensorRecord& t) {
  uint64_t n = 0;
  for (const auto& c : t.chunks) n += c.byte_length;
  return n;
}

// Each plain value of SaveOptions::content_metadata (or a safetensors
// "format"), by its path.
std::vector<std::pair<std::string, const distckpt::Value*>> content_items(
    const std::optional<distckpt::Value>& content) {
  std::vector<std::pair<std::string, const distckpt::Value*>> items;
  if (!content) return items;
  for (const auto& [path, value] : distckpt::nested_items(*content))
    items.emplace_back(distckpt::to_string(path), value);
  return items;
}

std::vector<std::string> common_keys(const distckpt::StorageReader& storage) {
  std::vector<std::string> keys;
  for (const auto& [path, value] : distckpt::nested_items(storage.read_common_state())) {
    keys.push_back(distckpt::to_string(path));
  }
  return keys;
}

int inspect(const std::string& dir, bool as_json) {
  const std::unique_ptr<distckpt::StorageReader> storage =
      distckpt::open_storage(dir, distckpt::StorageOptions{distckpt::StorageFormat::detected(), false});
  const distckpt::StorageIndex& md = storage->index();
  // Only the distckpt format records who saved it and under which layout.
  const auto* ours = dynamic_cast<const distckpt::storage::DistckptStorage*>(storage.get());
  const std::vector<std::string> common = common_keys(*storage);
  if (as_json) {
    nlohmann::json j;
    j["dir"] = dir;
    j["format"] = storage->format().name();
    if (ours != nullptr) {
      j["format_version"] = ours->header().format_version;
      j["world_size"] = ours->header().world_size;
      j["layout"] = {{"name", ours->header().layout_name}, {"fingerprint", ours->header().layout_fingerprint}};
      j["name_mappings"] = nlohmann::json::array();
      for (const distckpt::NameMapping& m : ours->header().name_mappings) j["name_mappings"].push_back(m.name());
    }
    j["tensors"] = nlohmann::json::array();
    for (const auto& t : md.tensors) {
      j["tensors"].push_back({{"key", t.key},
                              {"dtype", distckpt::stored_dtype_name(t)},
                              {"shape", t.global_shape},
                              {"chunks", t.chunks.size()},
                              {"bytes", stored_bytes(t)}});
    }
    j["objects"] = nlohmann::json::array();
    for (const auto& o : md.objects) {
      j["objects"].push_back({{"key", o.key}, {"unique_key", o.unique_key()}, {"bytes", o.byte_length}});
    }
    j["common_keys"] = common;
    j["content_metadata"] = nlohmann::json::object();
    const std::optional<distckpt::Value> content = storage->read_content_metadata();
    for (const auto& [path, value] : content_items(content)) j["content_metadata"][path] = plain_json(*value);
    std::cout << as_text(j) << '\n';
    return 0;
  }
  uint64_t total = 0;
  for (const auto& t : md.tensors) total += stored_bytes(t);
  if (ours != nullptr) {
    fmt::print("checkpoint {}\n  format version {}, saved by {}, {}, {} ({} bytes), {}\n", dir,
               ours->header().format_version, count(ours->header().world_size, "rank"), count(md.files.size(), "file"),
               count(md.tensors.size(), "tensor"), total, count(md.objects.size(), "object"));
    if (!ours->header().layout_name.empty()) {
      fmt::print("  layout {} ({})\n", ours->header().layout_name, ours->header().layout_fingerprint);
    }
    for (const distckpt::NameMapping& m : ours->header().name_mappings) {
      fmt::print("  name mapping {} (convert --to safetensors --map {})\n", m.name(), m.name());
    }
  } else {
    fmt::print("checkpoint {}\n  {}, {}, {} ({} bytes)\n", dir, storage->format().name(),
               count(md.files.size(), "file"), count(md.tensors.size(), "tensor"), total);
  }
  // Columns as wide as the longest key (keys come from files: control bytes escaped).
  size_t width = 3;
  for (const auto& t : md.tensors) width = std::max(width, printable(t.key).size());
  fmt::print("\ntensors:\n  {:<{}} {:<9} {:<20} {:>6} {:>14}\n", "key", width, "dtype", "shape", "chunks", "bytes");
  for (const auto& t : md.tensors) {
    fmt::print("  {:<{}} {:<9} {:<20} {:>6} {:>14}\n", printable(t.key), width, distckpt::stored_dtype_name(t),
               distckpt::to_string(t.global_shape), t.chunks.size(), stored_bytes(t));
  }
  fmt::print("\nobjects:\n");
  for (const auto& o : md.objects) fmt::print("  {} ({} bytes)\n", printable(o.unique_key()), o.byte_length);
  fmt::print("\ncommon keys:\n");
  for (const auto& k : common) fmt::print("  {}\n", printable(k));
  const std::optional<distckpt::Value> content = storage->read_content_metadata();
  const auto items = content_items(content);
  if (!items.empty()) fmt::print("\ncontent metadata:\n");
  for (const auto& [path, value] : items) fmt::print("  {}: {}\n", printable(path), plain_text(*value));
  return 0;
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
                              {"status", distckpt::status_name(report.status)},
                              {"format", report.format},
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
  if (report.intact() && report.format == "safetensors") {
    fmt::print("{}: intact (safetensors, {} files, {} bytes re-read; the format records no checksums)\n", dir,
               report.files, report.bytes_checked);
  } else if (report.intact() && report.format == "torch") {
    fmt::print("{}: intact (torch.save, {} bytes re-read, every record's CRC-32 matches)\n", dir, report.bytes_checked);
  } else if (report.intact() && report.format == "dcp") {
    fmt::print("{}: intact (PyTorch DCP, {} files, {} bytes re-read, every item archive's CRC-32s match)\n", dir,
               report.files, report.bytes_checked);
  } else if (report.intact()) {
    fmt::print("{}: intact (format version {}, {} files, {} bytes in {} blocks, every checksum matches)\n", dir,
               report.format_version, report.files, report.bytes_checked, report.blocks_checked);
  } else if (code == 1) {
    fmt::print(stderr, "{}: CORRUPT, {} problem(s) found; do not load it\n", dir, report.problems.size());
  } else {
    fmt::print(stderr, "{}: not a checkpoint\n", dir);
  }
  return code;
}

int digest(const std::string& dir) {
  for (const auto& d : distckpt::digest_checkpoint(dir)) fmt::print("{}\n", printable(d.line()));  // untrusted keys
  return 0;
}

// "5GB", "500MB", "2GiB", "1048576": bytes (powers of 1000 for kB..TB, of
// 1024 for KiB..TiB, as Hugging Face's max_shard_size reads them).
std::optional<uint64_t> parse_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 15) return std::nullopt;
  const uint64_t number = std::stoull(text.substr(0, digits));
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, uint64_t> units[] = {{"", 1},
                                                    {"B", 1},
                                                    {"KB", 1000},
                                                    {"MB", 1000000},
                                                    {"GB", 1000000000},
                                                    {"TB", 1000000000000},
                                                    {"KIB", 1 << 10},
                                                    {"MIB", 1 << 20},
                                                    {"GIB", uint64_t{1} << 30},
                                                    {"TIB", uint64_t{1} << 40}};
  for (const auto& [name, scale] : units) {
    if (unit == name) return number * scale;
  }
  return std::nullopt;
}

struct ConvertArgs {
  std::string dst, to, max_shard, dtype, map, torch = "2";
  bool quiet = false;
};

// --map NAME or LAYOUT.NAME: a mapping recorded in SRC (LAYOUT must be the one that saved it).
std::string mapping_name(const std::string& src, const std::string& map) {
  const size_t dot = map.find('.');
  if (dot == std::string::npos) return map;
  const std::string layout = map.substr(0, dot);
  const std::unique_ptr<distckpt::StorageReader> storage =
      distckpt::open_storage(src, distckpt::StorageOptions{distckpt::StorageFormat::detected(), false});
  const auto* ours = dynamic_cast<const distckpt::storage::DistckptStorage*>(storage.get());
  const std::string saved = ours == nullptr ? "" : ours->header().layout_name;
  if (saved != layout) {
    throw distckpt::Error(fmt::format("--map {}: '{}' was saved {}, not by layout '{}'", map, src,
                                      saved.empty() ? "without a layout" : "by layout '" + saved + "'", layout));
  }
  return map.substr(dot + 1);
}

// --map FILE.json: a mapping written by NameMapping::to_json, for a SRC that records none.
bool is_mapping_file(const std::string& map) { return map.size() > 5 && map.compare(map.size() - 5, 5, ".json") == 0; }

distckpt::NameMapping mapping_file(const std::string& path) {
  constexpr uint64_t kMaxMappingFileBytes = uint64_t{64} << 20;  // a 1T-parameter MoE's mapping is under 1 MiB
  return distckpt::NameMapping::from_json(distckpt::io::read_file(path, kMaxMappingFileBytes), path);
}

int convert(const std::string& src, const ConvertArgs& args) {
  distckpt::ConvertOptions options;
  if (is_mapping_file(args.map)) {
    options.name_mapping = mapping_file(args.map);
  } else if (!args.map.empty()) {
    options.mapping = mapping_name(src, args.map);
  }
  if (!args.max_shard.empty()) {
    const std::optional<uint64_t> bytes = parse_size(args.max_shard);
    if (!bytes) {
      fmt::print(stderr, "distckpt convert: --max-shard-size '{}' is not a size (e.g. 5GB, 500MB, 2GiB)\n",
                 args.max_shard);
      return 2;
    }
    options.max_shard_bytes = *bytes;
  }
  if (!args.dtype.empty()) {
    try {
      options.dtype = distckpt::dtype_from_name(args.dtype);
    } catch (const distckpt::CorruptionError&) {
      fmt::print(stderr, "distckpt convert: --dtype '{}' is not a dtype (e.g. bfloat16, float16, float32)\n",
                 args.dtype);
      return 2;
    } catch (const distckpt::Error& e) {
      fmt::print(stderr, "distckpt convert: --dtype {}: {}\n", args.dtype, e.what());
      return 2;
    }
  }
  // Progress for a person watching a terminal: done / total, rate, time left.
  const auto start = std::chrono::steady_clock::now();
  if (!args.quiet && isatty(STDERR_FILENO)) {
    options.progress = [&](uint64_t done, uint64_t total) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
      const double left = rate > 0 ? static_cast<double>(total - done) / rate : 0;
      fmt::print(stderr, "\rconverting: {:.1f} of {:.1f} MiB, {:.0f} MiB/s, {:.0f} s left   ", done / 1048576.0,
                 total / 1048576.0, rate / 1048576.0, left);
      if (done == total) fmt::print(stderr, "\n");
    };
  }
  distckpt::ConvertReport report;
  if (args.to == "safetensors") {
    report = distckpt::convert_to_safetensors(src, args.dst, options);
  } else if (args.to == "torch") {
    report = distckpt::convert_to_torch(src, args.dst, options);
  } else if (args.to == "dcp" || args.to == "torch_dist") {
    distckpt::DcpWriteOptions dcp;
    dcp.naming = args.torch == "1.13" ? distckpt::DcpWriteOptions::Naming::kTorch113
                                      : distckpt::DcpWriteOptions::Naming::kTorch2;
    dcp.torch_dist = args.to == "torch_dist";
    report = distckpt::convert_to_dcp(src, args.dst, dcp, options);
  } else {
    report = distckpt::convert_to_distckpt(src, args.dst, options);
  }
  if (!args.quiet) {
    fmt::print("{}: {} tensors, {} bytes in {} file(s) ({})\n", args.dst, report.tensors, report.bytes, report.files,
               args.to);
  }
  return 0;
}

// A hint for a command name that is not one: what other tools call ours.
std::string similar_command(const std::string& name) {
  static const std::pair<const char*, const char*> kSynonyms[] = {
      {"compare", "diff"},      {"cmp", "diff"},       {"check", "verify"}, {"validate", "verify"},
      {"info", "inspect"},      {"show", "inspect"},   {"list", "ls"},      {"rm", "rm-tensors"},
      {"remove", "rm-tensors"}, {"export", "convert"}, {"hash", "digest"}};
  for (const auto& [synonym, command] : kSynonyms) {
    if (name == synonym) return fmt::format(" (did you mean {}?)", command);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt: inspect, verify, digest, convert, diff and manage checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DISTCKPT_VERSION_STRING);
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
  ConvertArgs args;
  auto* convert_cmd = app.add_subcommand("convert", "write SRC's tensors in another format to DST (a new directory)");
  convert_cmd
      ->add_option("src", dir,
                   "checkpoint: distckpt, PyTorch DCP / torch_dist, safetensors (file or directory) or a torch.save "
                   "file (.pt, .bin)")
      ->required();
  convert_cmd->add_option("dst", args.dst, "directory to create (a .pt file for --to torch)")->required();
  convert_cmd
      ->add_option("--to", args.to,
                   "safetensors, torch (one file torch.load opens), distckpt, dcp (PyTorch's distributed checkpoint) "
                   "or torch_dist (Megatron-Core's)")
      ->required()
      ->check(CLI::IsMember({"safetensors", "torch", "distckpt", "dcp", "torch_dist"}));
  convert_cmd
      ->add_option("--torch", args.torch,
                   "dcp, torch_dist: the PyTorch whose module names .metadata uses: 2 (2.x, default) or 1.13")
      ->check(CLI::IsMember({"2", "1.13"}));
  convert_cmd->add_option("--max-shard-size", args.max_shard,
                          "safetensors: tensor bytes per file, e.g. 5GB (default: one file)");
  convert_cmd->add_option("--dtype", args.dtype, "store floating-point tensors as this dtype (e.g. bfloat16)");
  convert_cmd->add_option("--map", args.map,
                          "safetensors: name tensors by this mapping of the layout schema, recorded in SRC "
                          "(NAME or LAYOUT.NAME, e.g. gpt.llama), or by the mapping in FILE.json "
                          "(NameMapping::to_json; for a SRC saved without mappings: PyTorch DCP, torch_dist)");
  convert_cmd->add_flag("--quiet", args.quiet, "no progress, no summary");
  auto* ls_cmd = app.add_subcommand("ls", "the iter_* checkpoints under ROOT: committed or not, which is latest");
  ls_cmd->add_option("root", dir, "directory holding iter_* checkpoints")->required();
  ls_cmd->add_flag("--json", as_json, "machine-readable output");
  bool verify_each = false;
  ls_cmd->add_flag("--verify", verify_each,
                   "check each committed checkpoint as verify does (reads every byte): intact, or its first problem");
  std::string second;
  auto* rm_cmd = app.add_subcommand("rm-tensors", "remove the tensors whose key starts with PREFIX from DIR");
  rm_cmd->add_option("dir", dir, "checkpoint directory")->required();
  rm_cmd->add_option("prefix", second, "key prefix")->required();
  auto* diff_cmd = app.add_subcommand(
      "diff",
      "per tensor, common value and object: equal, or where A and B differ; exit 0 when the tensors and common "
      "state are equal (objects too with --objects), 1 when they differ");
  diff_cmd->add_option("a", dir, "checkpoint")->required();
  diff_cmd->add_option("b", second, "checkpoint")->required();
  diff_cmd->add_flag("--json", as_json, "machine-readable output");
  bool compare_objects = false;
  diff_cmd->add_flag("--objects", compare_objects,
                     "objects decide too (objects saved on another shard grid, such as per-tp extra state after "
                     "resharding, then count as different)");
  std::string key;
  auto* extract_cmd = app.add_subcommand("extract", "write one tensor, whole, to a .safetensors or .pt file");
  extract_cmd->add_option("dir", dir, "checkpoint")->required();
  extract_cmd->add_option("key", key, "tensor key")->required();
  extract_cmd->add_option("--to", second, "FILE.safetensors or FILE.pt (must not exist)")->required();
  std::vector<std::string> names;
  for (const CLI::App* command :
       {inspect_cmd, verify_cmd, digest_cmd, convert_cmd, ls_cmd, rm_cmd, diff_cmd, extract_cmd}) {
    names.push_back(command->get_name());
  }
  if (argc > 1 && argv[1][0] != '-' && std::find(names.begin(), names.end(), argv[1]) == names.end()) {
    fmt::print(stderr, "distckpt: unknown command '{}'{}; the commands are {} (distckpt --help)\n", argv[1],
               similar_command(argv[1]), fmt::join(names, ", "));
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; usage errors share verify's "not a checkpoint" code 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*inspect_cmd) return inspect(dir, as_json);
    if (*verify_cmd) return verify(dir, as_json);
    if (*convert_cmd) return convert(dir, args);
    if (*ls_cmd) return distckpt::cli::list_checkpoints(dir, as_json, verify_each);
    if (*rm_cmd) return distckpt::cli::remove_tensors(dir, second);
    if (*diff_cmd) return distckpt::cli::diff_checkpoints(dir, second, as_json, compare_objects);
    if (*extract_cmd) return distckpt::cli::extract_tensor(dir, key, second);
    return digest(dir);
  } catch (const std::exception& e) {  // distckpt errors, and file system or LibTorch ones on the way
    // The class first: scripts dispatch on it as programs do on the exception.
    fmt::print(stderr, "distckpt: {}: {}\n", distckpt::error_class_name(distckpt::error_kind_of(e)), e.what());
    return 2;
  }
}
