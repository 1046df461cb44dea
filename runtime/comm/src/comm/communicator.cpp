// The defaults of Communicator's optional operations, and the order of a
// batch's operations they and the c10d groups post in.
#include "distckpt/comm/communicator.h"

#include <fmt/format.h>

#include <map>
#include <utility>
#include <vector>

#include "comm/peer_order.h"
#include "distckpt/core/errors.h"

namespace distckpt {

namespace comm {

std::vector<PeerOp> pairwise_order(int me, const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs) {
  std::map<int, std::pair<std::vector<const PeerTensor*>, std::vector<const PeerTensor*>>> by_peer;
  for (const PeerTensor& s : sends) by_peer[s.peer].first.push_back(&s);
  for (const PeerTensor& r : recvs) by_peer[r.peer].second.push_back(&r);
  std::vector<PeerOp> order;
  order.reserve(sends.size() + recvs.size());
  const auto append = [&](const std::vector<const PeerTensor*>& list, bool send) {
    for (const PeerTensor* t : list) order.push_back(PeerOp{send, t});
  };
  for (const auto& [peer, lists] : by_peer) {
    if (peer == me) {
      throw CommError(fmt::format("exchange_tensors on rank {}: a rank cannot exchange tensors with itself", me));
    }
    append(me < peer ? lists.first : lists.second, me < peer);
    append(me < peer ? lists.second : lists.first, me > peer);
  }
  return order;
}

}  // namespace comm

void Communicator::exchange_tensors(const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs) {
  for (const comm::PeerOp& o : comm::pairwise_order(rank(), sends, recvs)) {
    if (o.send) {
      send_tensor(o.op->tensor, o.op->peer, o.op->tag);
    } else {
      at::Tensor landing = o.op->tensor;  // a handle: receiving writes the caller's tensor
      recv_tensor(landing, o.op->peer, o.op->tag);
    }
  }
}

}  // namespace distckpt
