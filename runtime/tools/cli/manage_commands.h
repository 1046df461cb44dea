// The commands that manage checkpoints: ls, rm-tensors, diff, extract.
#pragma once

#include <string>

namespace distckpt::cli {

int list_checkpoints(const std::string& root, bool as_json);
int remove_tensors(const std::string& dir, const std::string& prefix);
// Exit 0 when equal, 1 when they differ.
int diff_checkpoints(const std::string& left, const std::string& right, bool as_json);
int extract_tensor(const std::string& dir, const std::string& key, const std::string& file);

}  // namespace distckpt::cli
