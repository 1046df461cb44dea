// A transfer's sources seen as a checkpoint: the chunks every source rank
// holds (its main replicas and their copies, from every rank's plan) are the
// stored chunks, and reading a chunk copies it out of this rank's memory.
// A load through it (the same planner and exchange engine) fills any
// request from live tensors; only a chunk's holders can read it
// (holders(), which the load schedule chooses senders among): the ranks
// that hold it and, where its holder offers it (transfer/peer_memory.h),
// every rank of that holder's host, which reads it straight out of the
// holder's memory.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "distckpt/core/sharded_tensor.h"
#include "distckpt/storage/storage_reader.h"
#include "plan/local_plan.h"
#include "transfer/peer_memory.h"

namespace distckpt::transferring {

// The sources' structure, the same on every rank: the index of their
// distinct shards and who holds each. Kept while the sources keep their
// layout (a transfer repeated every step plans once).
struct SourceLayout {
  // `plans`: every rank's sources, by rank (checked: each tensor's main
  // replicas tile it exactly once, dtypes and shapes agree; ShardingError
  // otherwise).
  explicit SourceLayout(const std::vector<plan::LocalPlan>& plans);

  // A stored shard: key, box and flat range (none: [-1, -1)).
  using ShardKey = std::tuple<std::string, Shape, Shape, int64_t, int64_t>;
  static ShardKey key_of(const std::string& key, const Box& box, const std::optional<FlatRange>& flat);

  // Makes every rank of a group (peer_memory.h direct_groups) a holder of
  // each chunk one of its ranks offers (`reaches`, by rank; `plans` as
  // given to the constructor, addresses checked against them).
  void add_direct_readers(const std::vector<plan::LocalPlan>& plans, const std::vector<Reach>& reaches,
                          const std::vector<int>& groups);

  // Where a chunk can be read out of a holder's memory: rank -1 when nowhere.
  struct InMemory {
    int rank = -1;
    uint64_t address = 0;
  };

  StorageIndex index;
  std::vector<std::vector<std::vector<int>>> holders;        // per record and chunk, ascending ranks
  std::map<ShardKey, std::pair<uint32_t, uint32_t>> chunks;  // (record, chunk) of each shard
  std::vector<std::vector<InMemory>> in_memory;              // per record and chunk; empty: no direct reads
  std::vector<int64_t> pids;                                 // per rank, with in_memory
  std::vector<int> group_of_rank;                            // per rank, with in_memory (direct_groups)
};

class LiveSources final : public StorageReader {
 public:
  // `mine`: rank `rank`'s source tensors (they must outlive this).
  LiveSources(std::shared_ptr<const SourceLayout> layout, const std::vector<const ShardedTensor*>& mine, int rank);

  // The ranks that hold chunk `chunk` of record `tensor`, ascending.
  const std::vector<int>& holders(uint32_t tensor, uint32_t chunk) const {
    return layout_->holders.at(tensor).at(chunk);
  }

  StorageFormat format() const override { return StorageFormat("live"); }
  const std::string& location() const override { return location_; }
  const StorageIndex& index() const override { return layout_->index; }
  // Copies the bytes out of this rank's tensor (any layout or device), or
  // out of the memory of the rank of its host that offers it; UsageError
  // when this rank can do neither.
  void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) override;
  // Strided parts straight into their destinations, from either.
  void read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) override;
  std::string read_object(const ObjectRecord& object) override;
  Value read_common_state() const override;
  void verify(VerifyReport& report, const VerifyProgress& progress) override;
  // Bytes this rank copied out of its sources (for itself or to send).
  uint64_t bytes_read() const override { return bytes_read_; }
  // Of those, bytes read out of other ranks' memory.
  uint64_t bytes_read_directly() const { return bytes_read_directly_; }

 private:
  std::string location_ = "the transfer's sources";
  std::shared_ptr<const SourceLayout> layout_;
  int rank_;
  std::map<std::pair<uint32_t, uint32_t>, at::Tensor> held_;  // (record, chunk) -> this rank's data
  // The chunk's bytes [begin, end) checked against its size; `t` its record's place.
  void check_range(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end) const;
  // Where this rank reads chunk (t, chunk) of another rank's memory, if it does.
  const SourceLayout::InMemory* elsewhere(uint32_t t, uint32_t chunk) const;

  std::atomic<uint64_t> bytes_read_{0}, bytes_read_directly_{0};
};

}  // namespace distckpt::transferring
