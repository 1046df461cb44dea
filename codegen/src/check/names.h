// Name helpers of the checker's messages: "did you mean" suggestions for
// misspelled names, and name lists.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace distckpt::gen {

// Levenshtein distance.
size_t edit_distance(std::string_view a, std::string_view b);

// " (did you mean 'hidden'?)" for the closest candidate within edit distance
// 2, or "" when none is close enough to be a likely typo.
std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates);

// "tp, pp, dp".
std::string join_names(const std::vector<std::string>& names);

}  // namespace distckpt::gen
