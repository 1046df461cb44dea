// metadata.json, the commit marker. It is small and human-readable on
// purpose: tools (and people) can tell what wrote a directory without
// parsing metadata.fb, and its atomic creation is what commits a save.
#include "format/commit.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "distckpt/core/errors.h"
#include "format/metadata.h"
#include "io/file.h"

namespace distckpt {
namespace {

// A genuine marker is a few hundred bytes; anything near this is not ours.
constexpr uint64_t kMaxCommitFileBytes = uint64_t{1} << 20;
constexpr const char* kBackendName = "distckpt-fb";

using nlohmann::json;

std::string commit_path(const std::string& dir) { return io::safe_join(dir, kCommitFile); }

[[noreturn]] void reject(const std::string& path, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {}", path, what));
}

std::string string_field(const json& doc, const char* field, const std::string& path) {
  const auto it = doc.find(field);
  if (it == doc.end() || !it->is_string()) {
    reject(path, fmt::format("field \"{}\" is missing or not a string; the file is not a valid commit marker", field));
  }
  return it->get<std::string>();
}

int int_field(const json& doc, const char* field, const std::string& path) {
  const auto it = doc.find(field);
  if (it == doc.end() || !it->is_number_integer()) {
    reject(path,
           fmt::format("field \"{}\" is missing or not an integer; the file is not a valid commit marker", field));
  }
  const bool fits = it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t{std::numeric_limits<int>::max()}
                                             : it->get<int64_t>() >= std::numeric_limits<int>::min() &&
                                                   it->get<int64_t>() <= std::numeric_limits<int>::max();
  if (!fits) reject(path, fmt::format("field \"{}\" is out of range", field));
  return it->get<int>();
}

// Which program wrote a marker that is not ours: its "format", or the
// backend named by Megatron-Core's own metadata.json.
std::string foreign_writer(const json& doc) {
  for (const char* field : {"format", "sharded_backend"}) {
    const auto it = doc.find(field);
    if (it != doc.end() && it->is_string()) return it->get<std::string>();
  }
  return "an unknown program";
}

}  // namespace

std::optional<CheckpointConfig> maybe_load_config(const std::string& dir) {
  const std::string path = commit_path(dir);
  if (!io::exists(path)) return std::nullopt;
  const std::string text = io::read_file(path, kMaxCommitFileBytes);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    reject(path, fmt::format("malformed JSON ({}); the commit marker is damaged", e.what()));
  }
  if (!doc.is_object()) reject(path, "expected a JSON object; the commit marker is damaged");

  const auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || format->get<std::string>() != kFormatName) {
    reject(path,
           fmt::format("was written by '{}', not distckpt; load it with the tool that wrote it", foreign_writer(doc)));
  }
  CheckpointConfig config;
  config.format = kFormatName;
  config.version = int_field(doc, "version", path);
  if (config.version > static_cast<int>(kFormatVersion)) {
    reject(path, fmt::format("checkpoint format version {} is newer than this build of distckpt reads (version "
                             "{}); upgrade distckpt to load it",
                             config.version, kFormatVersion));
  }
  if (config.version < 1) reject(path, fmt::format("format version {} is not valid", config.version));
  config.sharded_backend = string_field(doc, "sharded_backend", path);
  config.common_backend = string_field(doc, "common_backend", path);
  config.world_size = int_field(doc, "world_size", path);
  if (config.world_size < 1) reject(path, fmt::format("world_size {} is not valid", config.world_size));
  // Informational only: markers written by hand or by older tools may lack it.
  if (doc.contains("created_by")) config.created_by = string_field(doc, "created_by", path);
  return config;
}

// Like Megatron's: a damaged marker is reported (it throws), not taken for
// "no checkpoint here", so a save never silently overwrites it.
bool is_distributed_checkpoint(const std::string& dir) { return maybe_load_config(dir).has_value(); }

void write_commit_marker(const std::string& dir, const CheckpointConfig& config) {
  if (config.world_size < 1) {
    throw Error(fmt::format("write_commit_marker: world_size {} is not valid (must be at least 1)", config.world_size));
  }
  // Fields left empty/zero mean "what this build writes".
  const json doc = {
      {"format", config.format.empty() ? std::string(kFormatName) : config.format},
      {"version", config.version == 0 ? static_cast<int>(kFormatVersion) : config.version},
      {"sharded_backend", config.sharded_backend.empty() ? std::string(kBackendName) : config.sharded_backend},
      {"common_backend", config.common_backend.empty() ? std::string(kBackendName) : config.common_backend},
      {"world_size", config.world_size},
      {"created_by", config.created_by.empty() ? std::string("distckpt " DISTCKPT_VERSION) : config.created_by},
  };
  io::write_file_atomic(commit_path(dir), doc.dump(2) + "\n");
}

}  // namespace distckpt
