// The defaults of Communicator's optional operations.
#include "distckpt/comm/communicator.h"

#include <fmt/format.h>

#include <map>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt {

// With blocking sends and receives: peer by peer in rank order, and with
// each peer the lower rank sends first. Every rank then meets its pairs in
// the same global order (by lower rank, then higher), so none waits on a
// rank that waits on it.
void Communicator::exchange_tensors(const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs) {
  std::map<int, std::pair<std::vector<const PeerTensor*>, std::vector<const PeerTensor*>>> by_peer;
  for (const PeerTensor& s : sends) by_peer[s.peer].first.push_back(&s);
  for (const PeerTensor& r : recvs) by_peer[r.peer].second.push_back(&r);
  const auto send_all = [&](const std::vector<const PeerTensor*>& list) {
    for (const PeerTensor* s : list) send_tensor(s->tensor, s->peer, s->tag);
  };
  const auto recv_all = [&](const std::vector<const PeerTensor*>& list) {
    for (const PeerTensor* r : list) {
      at::Tensor landing = r->tensor;  // a handle: receiving writes the caller's tensor
      recv_tensor(landing, r->peer, r->tag);
    }
  };
  for (const auto& [peer, lists] : by_peer) {
    if (peer == rank()) {
      throw CommError(fmt::format("exchange_tensors on rank {}: a rank cannot exchange tensors with itself", rank()));
    }
    if (rank() < peer) {
      send_all(lists.first);
      recv_all(lists.second);
    } else {
      recv_all(lists.second);
      send_all(lists.first);
    }
  }
}

}  // namespace distckpt
