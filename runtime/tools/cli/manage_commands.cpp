// distckpt ls / rm-tensors / diff / extract.
#include "manage_commands.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "distckpt/api/checkpoint.h"
#include "distckpt/api/checkpoint_manager.h"
#include "distckpt/api/compare.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/storage/backend.h"
#include "plain_values.h"

namespace distckpt::cli {

int list_checkpoints(const std::string& root, bool as_json, bool verify) {
  std::error_code error;
  if (is_object_store(root)) {
    if (!location_exists(root)) {
      fmt::print(stderr, "distckpt ls: '{}' holds no objects\n", root);
      return 2;
    }
  } else if (!std::filesystem::is_directory(root, error)) {
    fmt::print(stderr, "distckpt ls: '{}' {}\n", root,
               std::filesystem::exists(root, error) ? "is not a directory" : "does not exist");
    return 2;
  }
  const CheckpointManager manager(root);
  const std::vector<CheckpointEntry> entries = manager.list();
  // --verify: every committed one checked as `distckpt verify` would; the
  // first problem of one that is not intact.
  std::vector<std::optional<VerifyReport>> reports(entries.size());
  if (verify) {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].committed) reports[i] = verify_checkpoint(entries[i].path);
    }
  }
  if (as_json) {
    nlohmann::json j = nlohmann::json::array();
    for (size_t i = 0; i < entries.size(); ++i) {
      const CheckpointEntry& e = entries[i];
      nlohmann::json entry = {
          {"iteration", e.iteration}, {"path", e.path}, {"committed", e.committed}, {"latest", e.latest}};
      if (reports[i]) {
        entry["verify"] = status_name(reports[i]->status);
        entry["problems"] = reports[i]->problems;
      }
      j.push_back(std::move(entry));
    }
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    return 0;
  }
  if (entries.empty()) fmt::print("{}: no iter_* checkpoints\n", root);
  for (size_t i = 0; i < entries.size(); ++i) {
    const CheckpointEntry& e = entries[i];
    std::string verdict;
    if (reports[i]) {
      verdict = reports[i]->intact()
                    ? "  intact"
                    : fmt::format("  {}: {}", status_name(reports[i]->status),
                                  reports[i]->problems.empty() ? "" : printable(reports[i]->problems[0]));
    }
    fmt::print("{:>10}  {:<11} {}{}{}\n", e.iteration, e.committed ? "committed" : "incomplete", e.path,
               e.latest ? "  (latest)" : "", verdict);
  }
  return 0;
}

int remove_tensors(const std::string& dir, const std::string& prefix) {
  const size_t removed = remove_sharded_tensors(dir, prefix);
  if (removed == 0) {
    fmt::print(stderr, "distckpt rm-tensors: no tensor or object of {} starts with '{}'; nothing was changed\n", dir,
               prefix);
    return 1;
  }
  fmt::print("{}: removed {} key(s) starting with '{}'\n", dir, removed, prefix);
  return 0;
}

int diff_checkpoints(const std::string& left, const std::string& right, bool as_json, bool compare_objects) {
  const CheckpointDiff d = distckpt::diff_checkpoints(left, right);
  const bool equal = d.equal(compare_objects);
  if (as_json) {
    nlohmann::json j;
    j["equal"] = equal;
    j["tensors_equal"] = d.tensors_equal();
    j["objects_equal"] = d.objects_equal();
    j["tensors"] = nlohmann::json::array();
    for (const TensorDifference& t : d.tensors) {
      j["tensors"].push_back({{"key", t.key}, {"status", difference_status_name(t.status)}, {"detail", t.detail}});
    }
    j["common"] = {{"only_left", d.common_only_left}, {"only_right", d.common_only_right}, {"differ", d.common_differ}};
    j["objects"] = {{"only_left", d.objects_only_left},
                    {"only_right", d.objects_only_right},
                    {"differ", d.objects_differ},
                    {"other_grid", d.objects_other_grid}};
    j["content_metadata_differs"] = d.content_metadata_differs;
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    return equal ? 0 : 1;
  }
  for (const TensorDifference& t : d.tensors) {
    switch (t.status) {
      case TensorDifference::Status::kEqual:
        fmt::print("= {}\n", printable(t.key));
        break;
      case TensorDifference::Status::kOnlyLeft:
        fmt::print("- {} (only in {})\n", printable(t.key), left);
        break;
      case TensorDifference::Status::kOnlyRight:
        fmt::print("+ {} (only in {})\n", printable(t.key), right);
        break;
      default:
        fmt::print("! {}: {} {}\n", printable(t.key), difference_status_name(t.status), printable(t.detail));
    }
  }
  for (const std::string& p : d.common_only_left) fmt::print("- common {} (only in {})\n", printable(p), left);
  for (const std::string& p : d.common_only_right) fmt::print("+ common {} (only in {})\n", printable(p), right);
  // Differing common values with both sides, where each is one plain value.
  std::map<std::string, const Value*> left_values, right_values;
  const StateDict left_common = d.common_differ.empty() ? Value::dict() : load_common_state_dict(left);
  const StateDict right_common = d.common_differ.empty() ? Value::dict() : load_common_state_dict(right);
  for (const auto& [path, value] : nested_items(left_common)) left_values.emplace(to_string(path), value);
  for (const auto& [path, value] : nested_items(right_common)) right_values.emplace(to_string(path), value);
  for (const std::string& p : d.common_differ) {
    const auto a = left_values.find(p), b = right_values.find(p);
    if (a == left_values.end() || b == right_values.end()) {
      fmt::print("! common {}\n", printable(p));
    } else {
      fmt::print("! common {}: {} vs {}\n", printable(p), plain_text(*a->second), plain_text(*b->second));
    }
  }
  for (const std::string& k : d.objects_only_left) fmt::print("- object {} (only in {})\n", printable(k), left);
  for (const std::string& k : d.objects_only_right) fmt::print("+ object {} (only in {})\n", printable(k), right);
  for (const std::string& k : d.objects_differ) fmt::print("! object {}\n", printable(k));
  for (const std::string& k : d.objects_other_grid) {
    fmt::print("~ object {} (saved under another layout: not compared)\n", printable(k));
  }
  if (d.content_metadata_differs) fmt::print("! content metadata\n");
  if (equal && !d.objects_equal()) {
    fmt::print("equal tensors and common state; objects differ (they decide with --objects)\n");
  } else {
    fmt::print("{}\n", equal ? "equal" : "different");
  }
  return equal ? 0 : 1;
}

int extract_tensor(const std::string& dir, const std::string& key, const std::string& file) {
  distckpt::extract_tensor(dir, key, file);
  fmt::print("{}: '{}' from {}\n", file, key, dir);
  return 0;
}

}  // namespace distckpt::cli
