// Partitioned planning's steps run for W ranks in one process: the messages
// of one all-to-all, moved by hand.
#pragma once

#include <string>
#include <vector>

namespace distckpt::testing {

using Messages = std::vector<std::vector<std::string>>;  // [from][to]

// What each rank receives, [to][from], from what each sent, [from][to].
inline Messages transpose(const Messages& sent) {
  Messages got(sent.size(), std::vector<std::string>(sent.size()));
  for (size_t from = 0; from < sent.size(); ++from) {
    for (size_t to = 0; to < sent.size(); ++to) got[to][from] = sent[from][to];
  }
  return got;
}

}  // namespace distckpt::testing
