// The order in which a rank posts a batch of sends and receives so that
// transports that serialise the operations with one peer (blocking sends;
// c10d's NCCL send/recv, one stream per pair of ranks) cannot deadlock:
// peer by peer in rank order, and with each peer the lower rank sends first.
// Every rank then meets its pairs in the same global order (by lower rank,
// then higher), so none waits on a rank that waits on it.
#pragma once

#include <vector>

#include "distckpt/comm/communicator.h"

namespace distckpt::comm {

struct PeerOp {
  bool send = false;
  const PeerTensor* op = nullptr;
};

// Throws CommError for an operation with `me` itself.
std::vector<PeerOp> pairwise_order(int me, const std::vector<PeerTensor>& sends, const std::vector<PeerTensor>& recvs);

}  // namespace distckpt::comm
