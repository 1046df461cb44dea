// Name helpers (see names.h).
#include "check/names.h"

#include <fmt/format.h>

#include <algorithm>

namespace distckpt::gen {

size_t edit_distance(std::string_view a, std::string_view b) {
  // Two rows of the dynamic programme: distance of a[0..i) to b[0..j).
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  constexpr size_t kMaxDistance = 2;
  const std::string* best = nullptr;
  size_t best_distance = kMaxDistance + 1;
  for (const std::string& candidate : candidates) {
    // Cheap bound first: the length difference alone may rule it out.
    const size_t length_gap =
        candidate.size() > name.size() ? candidate.size() - name.size() : name.size() - candidate.size();
    if (length_gap >= best_distance) continue;
    const size_t distance = edit_distance(name, candidate);
    // Renaming every letter of a short name is no typo ('b' for 'a').
    if (distance < best_distance && distance < name.size()) {
      best = &candidate;
      best_distance = distance;
    }
  }
  return best ? fmt::format(" (did you mean '{}'?)", *best) : std::string();
}

std::string join_names(const std::vector<std::string>& names) { return fmt::format("{}", fmt::join(names, ", ")); }

}  // namespace distckpt::gen
