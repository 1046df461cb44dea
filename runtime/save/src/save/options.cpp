#include "distckpt/save/options.h"

#include "core/enum_names.h"

namespace distckpt {
namespace {

constexpr EnumNames<WriterPolicy, 3> kWriterNames{{
    {WriterPolicy::kBalanced, "balanced"},
    {WriterPolicy::kLowestRank, "lowest_rank"},
    {WriterPolicy::kMainReplica, "main_replica"},
}};

}  // namespace

WriterPolicy parse_writer_policy(const std::string& name) {
  return parse_enum_name(kWriterNames, name, "writer policy");
}
const char* writer_policy_name(WriterPolicy policy) { return enum_name(kWriterNames, policy); }

}  // namespace distckpt
