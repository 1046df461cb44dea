// The commands that manage checkpoints: ls, rm-tensors, diff, extract.
#pragma once

#include <string>

namespace distckpt::cli {

// --verify: each committed checkpoint checked as `distckpt verify` does.
int list_checkpoints(const std::string& root, bool as_json, bool verify);
int remove_tensors(const std::string& dir, const std::string& prefix);
// Exit 0 when the tensors, common state and content metadata are equal (and
// the objects, with `compare_objects`), 1 when they differ.
int diff_checkpoints(const std::string& left, const std::string& right, bool as_json, bool compare_objects);
int extract_tensor(const std::string& dir, const std::string& key, const std::string& file);

}  // namespace distckpt::cli
