// Executing a load's reads: pieces only this rank needs are read by a few
// threads (straight into the destination when its bytes are the stored
// bytes, else in slabs), while the main thread serves the pieces several
// ranks need: within a host through shared memory (load/host_exchange.h),
// across hosts as messages (load/exchange.h).
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/load/options.h"
#include "load/checkpoint_reader.h"
#include "load/device_staging.h"
#include "load/load_requests.h"

namespace distckpt::loading {

struct ReadEngineOptions {
  LoadExchange exchange = LoadExchange::kAuto;
  int threads = 2;
  uint64_t slab_bytes = uint64_t{8} << 20;
};

// A check that rides on the reads' first agreement, for a caller that
// replays a plan kept from an earlier load (a transfer's cache): every rank
// sends `mine` with its part, and `holds`, given every rank's (by rank),
// decides alike on every rank whether the plan still holds. When it does
// not, execute_reads reads nothing and sets `held` to false.
struct FirstAgreementCheck {
  std::string phase;  // what the agreement is called in errors
  std::string mine;
  std::function<bool(const std::vector<std::string>&)> holds;
  bool held = true;
};

// Collective, on a rank without a plan to replay while the others may run
// execute_reads with a FirstAgreementCheck: joins their first agreement
// with `check.mine` (which must make `holds` false) and sets `check.held`
// as every rank does; with `error` (this rank failed before), raises the
// error every rank then agrees on.
void join_first_read_agreement(Communicator& comm, FirstAgreementCheck& check,
                               const std::exception_ptr& error = nullptr);

// Collective: the load's agreement on planning its reads (`plan` plans
// them, round by round), which also carries what the read engine shares
// (load/read_planning.h): partitioned, each scheduler gets the needs of its
// pieces; the rounds exchange gathers every rank's needs. Returns what this
// rank received, by rank.
std::vector<std::string> agree_on_read_plans(Communicator& comm, const std::string& phase,
                                             const ReadEngineOptions& options,
                                             const std::function<const std::vector<std::vector<TensorRead>>&()>& plan);

// Collective: fills every read's destination, round by round (`rounds` from
// staging.plan_rounds): before a round, `staging` points its staged reads at
// host memory; after it, copies them to their destinations. When pieces are
// shared, every rank runs as many rounds as the rank with the most. `plans`:
// what agree_on_read_plans returned. Returns this rank's read error
// (a missing or corrupt piece, a failed transfer; nullptr when none) without
// agreeing on it: the caller folds it into its next agreement, which must
// follow on every rank, so that one collective reports it everywhere.
// `decisions` (partitioned planning): the schedulers' messages to this rank;
// when empty, they are scheduled (one collective) and kept there, else
// reused as they are (the same load again: every rank passes them).
// `earlier`: this rank's failure before the reads (planning them alone),
// which the first agreement reports on every rank. `check`: see
// FirstAgreementCheck; where the first agreement fails, execute_reads
// then raises its error (ranks that joined it without a plan did) instead of
// returning it.
[[nodiscard]] std::exception_ptr execute_reads(CheckpointReader& reader, std::vector<std::vector<TensorRead>>& rounds,
                                               Communicator& comm, const ReadEngineOptions& options,
                                               const std::vector<std::string>& plans, DeviceStaging& staging,
                                               std::vector<std::string>* decisions = nullptr,
                                               std::exception_ptr earlier = nullptr,
                                               FirstAgreementCheck* check = nullptr);

// Collective, on a rank that failed before it could run execute_reads (its
// reader never opened) while the others run it: joins their first
// agreement with `error` and returns what execute_reads returns on every
// rank then (the agreed error), for the caller's next agreement.
[[nodiscard]] std::exception_ptr fail_reads(Communicator& comm, const ReadEngineOptions& options,
                                            const std::exception_ptr& error);

}  // namespace distckpt::loading
