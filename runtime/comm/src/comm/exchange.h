// The one engine for rank-to-rank payloads (fully parallel load, tensor-aware
// state dicts). Every rank passes the same transfers in the same order and
// cuts them into the same windows; a window's sends and receives are posted
// together before any is waited for, so the exchange cannot deadlock.
//
// Transfers to oneself are produced and delivered locally, never sent. Extra
// memory per rank: one window's payloads, at most batch_bytes moved in all
// (point to point), or one round's, at most batch_bytes sent and batch_bytes
// received by the rank (rounds).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "distckpt/comm/communicator.h"

namespace distckpt::comm {

struct Transfer {
  int from = 0;
  int to = 0;
  uint64_t bytes = 0;  // the payload's exact size
};

enum class ExchangeMode {
  kPointToPoint,  // windows of at most batch_bytes, each one exchange_tensors batch
  // Rounds of one all-to-all each (fewer, larger collectives): in a round a
  // rank sends at most batch_bytes and receives at most batch_bytes, and
  // only its own payloads (a larger transfer is all its sender sends and its
  // receiver receives in its round).
  kRounds,
};

struct ExchangeCallbacks {
  // On the sender: transfer k's payload, a 1-d uint8 tensor of exactly
  // `bytes` elements on any device, valid until the next call. For a
  // transfer to oneself it goes to deliver as is (it may be undefined when
  // produce already put the data in place).
  std::function<at::Tensor(size_t k)> produce;
  // Optional, on the receiver (point to point): a contiguous uint8 tensor of
  // `bytes` elements on comm.tensor_device() to receive straight into, or an
  // undefined tensor. A payload received there is not passed to deliver.
  std::function<at::Tensor(size_t k)> landing;
  // On the receiver: transfer k's payload (a uint8 tensor, valid during the call).
  std::function<void(size_t k, const at::Tensor& payload)> deliver;
};

// Collective. Communication failures throw CommError; a peer whose
// contribution does not match the transfers throws ProtocolError (rounds:
// after the last round, so that every rank runs every round).
void exchange(Communicator& comm, const std::vector<Transfer>& transfers, const ExchangeCallbacks& callbacks,
              ExchangeMode mode, uint64_t batch_bytes);

// A host buffer seen as a payload (no copy).
at::Tensor payload_view(const void* data, uint64_t bytes);

}  // namespace distckpt::comm
