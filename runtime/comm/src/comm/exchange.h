// The one engine for rank-to-rank payloads (fully parallel load, tensor-aware
// state dicts). Each transfer carries a window (point to point) or a round
// (rounds) that its sender and its receiver agree on, and every rank runs its
// windows in ascending order: a window's sends and receives are posted
// together before any is waited for, so the exchange cannot deadlock. Either
// every rank passes the same transfers (exchange: the engine cuts the
// windows), or each passes only its own with their keys, as a planner that no
// rank sees whole assigned them (exchange_keyed).
//
// Transfers to oneself are produced and delivered locally, never sent. Extra
// memory per rank: one window's payloads, or one round's. The windows bound
// them: cut_windows keeps a window to at most batch_bytes moved in all (point
// to point), a round to at most batch_bytes sent and batch_bytes received by
// each rank (rounds); a planner that keys transfers itself cuts them so.
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

// A transfer and where it runs: its window (point to point: ascending keys,
// a window's transfers posted together) or its round (rounds), and a tag
// that tells it apart from the other transfers of its pair in its window.
struct KeyedTransfer {
  Transfer transfer;
  uint64_t window = 0;
  uint32_t tag = 0;
};

// The windows of `transfers` (every rank's, in one order): point to point,
// consecutive runs of at most batch_bytes moved (a larger transfer alone);
// rounds, as the rounds mode cuts them (at most batch_bytes sent and
// received per rank and round). Tags: the transfer's index. `count`: the
// number of windows.
std::vector<KeyedTransfer> cut_windows(const std::vector<Transfer>& transfers, size_t world, ExchangeMode mode,
                                       uint64_t batch_bytes, uint64_t* count = nullptr);

// Collective: exchange with the transfers this rank sends or receives
// (callbacks index `mine`), sorted by (window, tag). Rounds: `rounds` is the
// number of rounds, the same on every rank (every rank runs each one).
void exchange_keyed(Communicator& comm, const std::vector<KeyedTransfer>& mine, const ExchangeCallbacks& callbacks,
                    ExchangeMode mode, uint64_t rounds = 0);

// Tests only: called on every payload a rank is about to send to another
// (say, to flip a byte in flight). Process-wide; set it while no exchange
// runs, and reset it with an empty function.
using PayloadTamper = std::function<void(const Transfer& transfer, at::Tensor& payload)>;
void set_payload_tamper_for_testing(PayloadTamper tamper);

// A host buffer seen as a payload (no copy).
at::Tensor payload_view(const void* data, uint64_t bytes);

}  // namespace distckpt::comm
