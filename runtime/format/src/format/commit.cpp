// metadata.json, the commit marker. It is small and human-readable on
// purpose: tools (and people) can tell what wrote a directory without
// parsing metadata.fb, and its atomic creation is what commits a save.
// From version 2 it is also the root of the checkpoint's integrity: it
// records the size and XXH3 of metadata.fb (which holds the checksums of
// every data block) and of common.fb, and it is parsed strictly, so no
// flipped bit anywhere in a checkpoint can pass unnoticed.
#include "format/commit.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "distckpt/core/errors.h"
#include "format/metadata.h"
#include "io/checksum.h"
#include "io/file.h"

namespace distckpt {
namespace {

// A genuine marker is a few hundred bytes; anything near this is not ours.
constexpr uint64_t kMaxCommitFileBytes = uint64_t{1} << 20;
constexpr const char* kBackendName = "distckpt-fb";

using nlohmann::json;

std::string commit_path(const std::string& dir) { return io::safe_join(dir, kCommitFile); }

// `path`: the file the failure is about, when known (`origin` may say more than a path).
[[noreturn]] void reject(const std::string& origin, const std::string& what, const std::string& path = {}) {
  throw CorruptionError(fmt::format("{}: {}", origin, what), path);
}

const json& field(const json& doc, const char* name, const std::string& origin) {
  const auto it = doc.find(name);
  if (it == doc.end()) reject(origin, fmt::format("field \"{}\" is missing; the commit marker is damaged", name));
  return *it;
}

std::string string_field(const json& doc, const char* name, const std::string& origin) {
  const json& value = field(doc, name, origin);
  if (!value.is_string())
    reject(origin, fmt::format("field \"{}\" is not a string; the commit marker is damaged", name));
  return value.get<std::string>();
}

uint64_t unsigned_field(const json& doc, const char* name, uint64_t max, const std::string& origin) {
  const json& value = field(doc, name, origin);
  if (!value.is_number_integer()) {
    reject(origin, fmt::format("field \"{}\" is not an integer; the commit marker is damaged", name));
  }
  if (!value.is_number_unsigned() || value.get<uint64_t>() > max) {
    reject(origin, fmt::format("field \"{}\" is out of range", name));
  }
  return value.get<uint64_t>();
}

int int_field(const json& doc, const char* name, const std::string& origin) {
  return static_cast<int>(unsigned_field(doc, name, std::numeric_limits<int>::max(), origin));
}

// Version 2 markers carry nothing else: a field that is not one of these is
// a damaged name (or a marker edited by hand), never silently ignored.
void reject_unknown_fields(const json& doc, const std::set<std::string>& known, const std::string& origin) {
  for (const auto& [name, value] : doc.items()) {
    if (known.count(name) == 0) {
      reject(origin, fmt::format("unknown field \"{}\"; the commit marker is damaged or was edited", name));
    }
  }
}

uint64_t parse_hex64(const std::string& text, const std::string& origin, const char* what) {
  uint64_t value = 0;
  bool valid = text.size() == 16;
  for (const char c : text) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) valid = false;
    value = value << 4 | static_cast<uint64_t>(digit & 0xf);
  }
  if (!valid) reject(origin, fmt::format("{}: \"xxh3\" must be 16 lowercase hex digits, not \"{}\"", what, text));
  return value;
}

// `with_head`: metadata.fb of format 3, which records its head too.
RecordedFile recorded_file(const json& doc, const char* name, bool with_head, const std::string& origin) {
  const json& entry = field(doc, name, origin);
  if (!entry.is_object()) reject(origin, fmt::format("field \"{}\" is not an object", name));
  const std::string where = fmt::format("{}: field \"{}\"", origin, name);
  if (with_head) {
    reject_unknown_fields(entry, {"file", "bytes", "xxh3", "head_bytes", "head_xxh3"}, where);
  } else {
    reject_unknown_fields(entry, {"file", "bytes", "xxh3"}, where);
  }
  RecordedFile record;
  record.path = string_field(entry, "file", where);
  try {
    io::validate_relative_path(record.path);
  } catch (const CorruptionError& e) {
    reject(where, e.what(), e.path());
  }
  record.bytes = unsigned_field(entry, "bytes", std::numeric_limits<uint64_t>::max(), where);
  record.xxh3 = parse_hex64(string_field(entry, "xxh3", where), origin, name);
  if (with_head) {
    record.head_bytes = unsigned_field(entry, "head_bytes", record.bytes, where);
    if (record.head_bytes == 0) reject(where, "\"head_bytes\" is 0; the commit marker is damaged");
    record.head_xxh3 = parse_hex64(string_field(entry, "head_xxh3", where), origin, name);
  }
  return record;
}

json recorded_json(const RecordedFile& record, bool with_head) {
  json entry = {{"file", record.path}, {"bytes", record.bytes}, {"xxh3", io::hex64(record.xxh3)}};
  if (with_head) {
    entry["head_bytes"] = record.head_bytes;
    entry["head_xxh3"] = io::hex64(record.head_xxh3);
  }
  return entry;
}

// Which program wrote a marker that is not ours: its "format", or the
// backend named by Megatron-Core's own metadata.json.
std::string foreign_writer(const json& doc) {
  for (const char* name : {"format", "sharded_backend"}) {
    const auto it = doc.find(name);
    if (it != doc.end() && it->is_string()) return it->get<std::string>();
  }
  return "an unknown program";
}

// The program that wrote a marker that is not ours; nullopt for ours, and
// for text that is no JSON object at all (the strict parse reports that).
std::optional<std::string> foreign_writer_of(std::string_view text) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  const auto format = doc.find("format");
  if (format != doc.end() && format->is_string() && format->get<std::string>() == kFormatName) return std::nullopt;
  return foreign_writer(doc);
}

}  // namespace

uint64_t max_commit_marker_bytes() { return kMaxCommitFileBytes; }

CheckpointConfig parse_commit_marker(std::string_view text, const std::string& origin) {
  if (text.size() > kMaxCommitFileBytes) {
    reject(origin, fmt::format("{} bytes, more than a commit marker can be; the file is not ours", text.size()));
  }
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    reject(origin, fmt::format("malformed JSON ({}); the commit marker is damaged", e.what()));
  }
  if (!doc.is_object()) reject(origin, "expected a JSON object; the commit marker is damaged");

  const auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || format->get<std::string>() != kFormatName) {
    throw CheckpointError(fmt::format("{}: was written by '{}', not distckpt; load it with the tool that wrote it",
                                      origin, foreign_writer(doc)));
  }
  CheckpointConfig config;
  config.format = kFormatName;
  config.version = int_field(doc, "version", origin);
  if (config.version > static_cast<int>(kFormatVersion)) {
    throw CheckpointError(
        fmt::format("{}: checkpoint format version {} is newer than this build of distckpt reads (version {}); upgrade "
                    "distckpt to load it",
                    origin, config.version, kFormatVersion));
  }
  if (config.version < static_cast<int>(kOldestFormatVersion)) {
    reject(origin, fmt::format("format version {} is not valid", config.version));
  }
  config.sharded_backend = string_field(doc, "sharded_backend", origin);
  config.common_backend = string_field(doc, "common_backend", origin);
  config.sharded_backend_version = config.common_backend_version = config.version;
  config.world_size = int_field(doc, "world_size", origin);
  if (config.world_size < 1) reject(origin, fmt::format("world_size {} is not valid", config.world_size));
  if (config.version == 1) {
    // Informational only: version 1 markers written by hand may lack it.
    if (doc.contains("created_by")) config.created_by = string_field(doc, "created_by", origin);
    return config;
  }
  reject_unknown_fields(
      doc, {"format", "version", "sharded_backend", "common_backend", "world_size", "created_by", "metadata", "common"},
      origin);
  if (config.sharded_backend != kBackendName || config.common_backend != kBackendName) {
    reject(origin, fmt::format("unknown backend '{}'/'{}' (this build writes and reads '{}')", config.sharded_backend,
                               config.common_backend, kBackendName));
  }
  config.created_by = string_field(doc, "created_by", origin);
  config.metadata = recorded_file(doc, "metadata", config.version >= 3, origin);
  config.common = recorded_file(doc, "common", false, origin);
  return config;
}

std::optional<CheckpointConfig> config_of_marker(std::string_view text, const std::string& origin) {
  // Like Megatron's for its own markers: another tool's checkpoint (a Megatron
  // torch_dist one, say) is not a distckpt checkpoint; writer_of_marker names the tool.
  if (foreign_writer_of(text)) return std::nullopt;
  return parse_commit_marker(text, origin);
}

std::string writer_of_marker(std::string_view text, const std::string& origin) {
  if (std::optional<std::string> foreign = foreign_writer_of(text)) return *foreign;
  parse_commit_marker(text, origin);  // a damaged marker of ours is reported, not guessed at
  return std::string(kFormatName);
}

CheckpointConfig commit_config(int world_size, RecordedFile metadata, RecordedFile common) {
  CheckpointConfig config;
  config.metadata = std::move(metadata);
  config.common = std::move(common);
  config.format = kFormatName;
  config.version = static_cast<int>(kFormatVersion);
  config.sharded_backend = kBackendName;
  config.common_backend = kBackendName;
  config.world_size = world_size;
  config.created_by = std::string("distckpt ") + DISTCKPT_VERSION;
  return config;
}

void write_commit_marker(const std::string& dir, const CheckpointConfig& config) {
  io::write_file_atomic(commit_path(dir), encode_commit_marker(config));
}

std::string encode_commit_marker(const CheckpointConfig& config) {
  if (config.world_size < 1) {
    throw UsageError(
        fmt::format("write_commit_marker: world_size {} is not valid (must be at least 1)", config.world_size));
  }
  const int version = config.version == 0 ? static_cast<int>(kFormatVersion) : config.version;
  if (version >= 2 && (!config.metadata || !config.common)) {
    throw UsageError(fmt::format("write_commit_marker: format version {} records metadata.fb and common.fb", version));
  }
  if (version >= 3 && (config.metadata->head_bytes == 0 || config.metadata->head_bytes > config.metadata->bytes)) {
    throw UsageError(fmt::format(
        "write_commit_marker: format version {} records metadata.fb's head (record it with record_metadata)", version));
  }
  // Fields left empty/zero mean "what this build writes".
  json doc = {
      {"format", config.format.empty() ? std::string(kFormatName) : config.format},
      {"version", version},
      {"sharded_backend", config.sharded_backend.empty() ? std::string(kBackendName) : config.sharded_backend},
      {"common_backend", config.common_backend.empty() ? std::string(kBackendName) : config.common_backend},
      {"world_size", config.world_size},
      {"created_by", config.created_by.empty() ? std::string("distckpt " DISTCKPT_VERSION) : config.created_by},
  };
  if (version >= 2) {
    doc["metadata"] = recorded_json(*config.metadata, version >= 3);
    doc["common"] = recorded_json(*config.common, false);
  }
  return doc.dump(2) + "\n";
}

RecordedFile record_file(const std::string& path, std::string_view bytes) {
  return RecordedFile{path, bytes.size(), io::xxh3(bytes.data(), bytes.size())};
}

RecordedFile record_metadata(const std::string& path, std::string_view encoded) {
  RecordedFile record = record_file(path, encoded);
  record.head_bytes = metadata_head_bytes(encoded);
  record.head_xxh3 = io::xxh3(encoded.data(), record.head_bytes);
  return record;
}

void check_recorded_size(const RecordedFile& record, uint64_t actual, const std::string& full_path) {
  if (actual != record.bytes) {
    throw CorruptionError(fmt::format(
        "{} has {} bytes but the commit marker ({}) records {}: the file was truncated or replaced; the checkpoint "
        "is corrupt, load an intact copy",
        full_path, actual, kCommitFile, record.bytes));
  }
}

void check_recorded_head(const RecordedFile& record, std::string_view head, const std::string& full_path) {
  const uint64_t actual = io::xxh3(head.data(), head.size());
  if (head.size() != record.head_bytes || actual != record.head_xxh3) {
    throw CorruptionError(
        fmt::format("checksum mismatch in {}: XXH3 {} of its first {} bytes (its index) but the commit marker ({}) "
                    "records {} of {}; the checkpoint is corrupt, run `distckpt verify` and load an intact copy",
                    full_path, io::hex64(actual), head.size(), kCommitFile, io::hex64(record.head_xxh3),
                    record.head_bytes),
        full_path);
  }
}

void check_recorded_file(const RecordedFile& record, std::string_view bytes, const std::string& full_path) {
  check_recorded_size(record, bytes.size(), full_path);
  const uint64_t actual = io::xxh3(bytes.data(), bytes.size());
  if (actual != record.xxh3) {
    throw CorruptionError(fmt::format(
        "checksum mismatch in {}: XXH3 {} but the commit marker ({}) records {}; the checkpoint is corrupt, run "
        "`distckpt verify` and load an intact copy",
        full_path, io::hex64(actual), kCommitFile, io::hex64(record.xxh3)));
  }
}

}  // namespace distckpt
