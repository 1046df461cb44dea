#include "nccl/unique_id.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt::nccl {
namespace {

// A stored value is a tag byte and its content: the id, or rank 0's error.
constexpr uint8_t kIdTag = 'I';
constexpr uint8_t kErrorTag = 'E';

std::string cause_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace

std::string next_unique_id_key() {
  static std::atomic<uint64_t> generation{0};
  return fmt::format("distckpt/nccl/{}/unique_id", generation++);
}

ncclUniqueId share_unique_id(c10d::Store& store, const std::string& key, int rank, std::chrono::milliseconds timeout) {
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    std::vector<uint8_t> value;
    if (made == ncclSuccess) {
      value.push_back(kIdTag);
      value.insert(value.end(), id.internal, id.internal + sizeof id.internal);
    } else {
      const std::string error = fmt::format("ncclGetUniqueId failed on rank 0: {}", ncclGetErrorString(made));
      value.push_back(kErrorTag);
      value.insert(value.end(), error.begin(), error.end());
    }
    try {
      store.set(key, value);
    } catch (const std::exception& e) {
      throw CommError(
          fmt::format("rank 0 could not publish the NCCL unique id under '{}' in the store: {}", key, cause_of(e)));
    }
    if (made != ncclSuccess) {
      throw CommError(std::string(value.begin() + 1, value.end()) + "; is a network interface up?");
    }
    return id;
  }
  std::vector<uint8_t> value;
  try {
    store.wait({key}, timeout);
    value = store.get(key);
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "rank {} did not receive the NCCL unique id from rank 0 (store key '{}') within {} ms: {}; check that rank 0 "
        "started and reached communicator creation",
        rank, key, timeout.count(), cause_of(e)));
  }
  if (!value.empty() && value[0] == kErrorTag) {
    throw CommError(fmt::format("rank {}: {}", rank, std::string(value.begin() + 1, value.end())));
  }
  if (value.size() != 1 + sizeof id.internal || value[0] != kIdTag) {
    throw CommError(
        fmt::format("rank {}: store key '{}' holds {} bytes, not a NCCL unique id ({} bytes and a tag); "
                    "is another program using the same store keys?",
                    rank, key, value.size(), sizeof id.internal));
  }
  std::memcpy(id.internal, value.data() + 1, sizeof id.internal);
  return id;
}

}  // namespace distckpt::nccl
