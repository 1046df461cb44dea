#include "distckpt/save/plan_cache.h"

#include "distckpt/storage/backend.h"
#include "save/save_plan.h"
#include "storage/distckpt_storage.h"

namespace distckpt {

SavePlanCache::SavePlanCache() : state_(std::make_unique<State>()) {}
SavePlanCache::~SavePlanCache() = default;

std::shared_ptr<SavePlanCache> SavePlanCache::create() { return std::shared_ptr<SavePlanCache>(new SavePlanCache()); }

std::shared_ptr<SavePlanCache> SavePlanCache::from_checkpoint(const std::string& dir) {
  std::shared_ptr<SavePlanCache> cache = create();
  // Opened, not decoded: each rank looks its own records up when it plans.
  cache->state_->seed = std::make_shared<const storage::DistckptStorage>(std::shared_ptr<Backend>(open_backend(dir)),
                                                                         /*verify_checksums=*/false);
  return cache;
}

uint64_t SavePlanCache::plans_made() const { return state_->made; }
uint64_t SavePlanCache::plans_reused() const { return state_->reused; }

void SavePlanCache::invalidate() {
  const uint64_t made = state_->made, reused = state_->reused;
  *state_ = State{};
  state_->made = made;
  state_->reused = reused;
}

}  // namespace distckpt
