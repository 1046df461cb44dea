#include "load/load_result.h"

#include "distckpt/core/dict_utils.h"

namespace distckpt::loading {

LoadResult assemble_load_result(Value common, const SplitStateDict& split, const Value& request, KeyMismatch mismatch,
                                StrictHandling strict) {
  LoadResult result;
  result.state_dict = common.is_dict() ? std::move(common) : Value::dict();
  merge(result.state_dict, split.sharded);
  merge(result.state_dict, unwrap_non_persistent(split.non_persistent));
  apply_factory_merges(result.state_dict, request, /*skip_absent=*/true);
  if (strict == StrictHandling::kReturnUnexpected || strict == StrictHandling::kReturnAll) {
    result.unexpected_keys = std::move(mismatch.unexpected);
    result.missing_keys = std::move(mismatch.missing);
  }
  return result;
}

}  // namespace distckpt::loading
