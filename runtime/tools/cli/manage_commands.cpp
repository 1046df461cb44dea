// distckpt ls / rm-tensors / diff / extract.
#include "manage_commands.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "distckpt/api/checkpoint.h"
#include "distckpt/api/checkpoint_manager.h"
#include "distckpt/api/compare.h"
#include "distckpt/core/dict_utils.h"
#include "plain_values.h"

namespace distckpt::cli {

int list_checkpoints(const std::string& root, bool as_json) {
  std::error_code error;
  if (!std::filesystem::is_directory(root, error)) {
    fmt::print(stderr, "distckpt ls: '{}' {}\n", root,
               std::filesystem::exists(root, error) ? "is not a directory" : "does not exist");
    return 2;
  }
  const CheckpointManager manager(root);
  const std::vector<CheckpointEntry> entries = manager.list();
  if (as_json) {
    nlohmann::json j = nlohmann::json::array();
    for (const CheckpointEntry& e : entries) {
      j.push_back({{"iteration", e.iteration}, {"path", e.path}, {"committed", e.committed}, {"latest", e.latest}});
    }
    std::cout << j.dump(2) << '\n';
    return 0;
  }
  if (entries.empty()) fmt::print("{}: no iter_* checkpoints\n", root);
  for (const CheckpointEntry& e : entries) {
    fmt::print("{:>10}  {:<11} {}{}\n", e.iteration, e.committed ? "committed" : "incomplete", e.path,
               e.latest ? "  (latest)" : "");
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

int diff_checkpoints(const std::string& left, const std::string& right, bool as_json) {
  const CheckpointDiff d = distckpt::diff_checkpoints(left, right);
  if (as_json) {
    nlohmann::json j;
    j["equal"] = d.equal();
    j["tensors"] = nlohmann::json::array();
    for (const TensorDifference& t : d.tensors) {
      j["tensors"].push_back({{"key", t.key}, {"status", difference_status_name(t.status)}, {"detail", t.detail}});
    }
    j["common"] = {{"only_left", d.common_only_left}, {"only_right", d.common_only_right}, {"differ", d.common_differ}};
    j["objects"] = {
        {"only_left", d.objects_only_left}, {"only_right", d.objects_only_right}, {"differ", d.objects_differ}};
    j["content_metadata_differs"] = d.content_metadata_differs;
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    return d.equal() ? 0 : 1;
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
  if (d.content_metadata_differs) fmt::print("! content metadata\n");
  fmt::print("{}\n", d.equal() ? "equal" : "different");
  return d.equal() ? 0 : 1;
}

int extract_tensor(const std::string& dir, const std::string& key, const std::string& file) {
  distckpt::extract_tensor(dir, key, file);
  fmt::print("{}: '{}' from {}\n", file, key, dir);
  return 0;
}

}  // namespace distckpt::cli
