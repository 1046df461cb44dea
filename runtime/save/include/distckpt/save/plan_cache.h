// Reusing a save plan while the state dict keeps its structure.
//
// Planning a save validates the global sharding, chooses writers and lays
// out the metadata, in four all-to-alls among every rank (partitioned: no
// rank holds every rank's plan). When every
// rank's plan has the same structure as last time (same keys, dtypes,
// shapes, boxes, replica ids; tensor values and object sizes may change), all
// of that is reused: the only planning collective left is one all-gather of
// 16 bytes per rank, which is also how every rank learns, identically, that
// the plan still holds. Any change anywhere (new key, other mesh, other
// writer policy) falls back to full planning and refreshes the cache.
//
// Each rank keeps its own cache object (the coordinator's also holds the
// metadata skeleton). After a restart, seed it from the last checkpoint:
// that checkpoint records every rank's structure hash and writer policy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace distckpt {

class SavePlanCache {
 public:
  static std::shared_ptr<SavePlanCache> create();
  // Seeded from a committed checkpoint: the next save reuses its plan if
  // every rank's structure matches what that checkpoint recorded. Reads the
  // checkpoint's metadata on every rank that calls it; the next save decodes
  // the records of each rank's own keys there (the coordinator's: all).
  static std::shared_ptr<SavePlanCache> from_checkpoint(const std::string& dir);

  ~SavePlanCache();
  SavePlanCache(const SavePlanCache&) = delete;
  SavePlanCache& operator=(const SavePlanCache&) = delete;

  uint64_t plans_made() const;    // saves that planned from scratch
  uint64_t plans_reused() const;  // saves that reused the cached plan
  void invalidate();              // the next save plans from scratch

 private:
  struct State;                       // defined by the runtime
  friend struct SavePlanCacheAccess;  // the runtime's planner
  SavePlanCache();
  std::unique_ptr<State> state_;
};

}  // namespace distckpt
