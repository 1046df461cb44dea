// Fully parallel load within one host: a shared piece whose needers all run
// on one host (plan::SharePiece::same_host) is read once, by its reader,
// into a shared-memory region (io/shared_memory.h) that the other needers map
// read-only and copy their parts from. The bytes never pass through a socket,
// and after two collectives that set the regions up (the first one is the
// caller's agreement on planning) no collective runs: the ranks signal each
// other through counters in their regions.
//
// The slabs run in rounds. A reading rank's region holds four slots of at
// most one batch (or one slab, if larger); its round t uses slot t % 4. It
// places its slabs itself and tells each needer where the slabs it needs lie
// (its offer), so no rank knows more than its own share. A reader thread on
// every reading rank fills round t's slot once round t - 4 is done there and
// every needer of its slabs has copied it (their "copied" counters), then
// raises its "produced" counter; the main thread of every rank copies its
// parts of round t once each reader it needs has produced it, then raises
// "copied", through the last round of any reader it copies from. A read that
// fails marks its slab failed (a status byte beside the counters) and the
// needers skip it. A wait fails with CommError when the peer raised its
// "abandoned" word (it failed), when its process is gone, or when its counter
// stood still for the communicator's timeout.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "load/exchange.h"

namespace distckpt::loading {

// One load's exchange within the host.
class HostExchange {
 public:
  // Not collective: places the slabs of the share's same_host pieces this
  // rank reads. `context` (and the share it names) must outlive this object.
  explicit HostExchange(const ExchangeContext& context);
  ~HostExchange();
  HostExchange(const HostExchange&) = delete;
  HostExchange& operator=(const HostExchange&) = delete;

  // Not collective: creates this rank's shared-memory region when it takes
  // part and returns, part r for rank r, what rank r needs to map it and
  // find its slabs there (empty for a rank it shares nothing with; a refusal
  // when the region could not be made). The caller sends the parts with its
  // agreement on planning.
  std::vector<std::string> offers();

  // Collective. Given what every rank offered this one, by rank: maps the
  // peers' regions and removes this rank's name, returning true; or, when
  // some rank could not set up or map shared memory, or an offer does not
  // match the share, returns false on every rank (having logged why) so that
  // each rank reads its parts of those pieces itself. Communication failures
  // throw CommError.
  bool set_up(const std::vector<std::string>& offers);

  // After set_up returned true: serves every same_host piece of the
  // share, keeping this rank's first read error in `error`. Waits on
  // peers through the regions' counters (CommError when one gave up, died
  // or stood still for the timeout); no collective.
  void run(std::exception_ptr& error);

 private:
  class Rounds;  // the slabs' rounds, the regions and the counters (host_exchange.cpp)
  std::unique_ptr<Rounds> rounds_;
};

}  // namespace distckpt::loading
