#include "save/streamed_save.h"

#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "plan/global_plan.h"
#include "save/save_finalize.h"
#include "save/save_plan.h"
#include "storage/object_commit.h"
#include "storage/object_sink.h"

namespace distckpt::saving {

// One item's block checksums (io/checksum.h) from bytes that arrive in
// pieces of any size: the same values as checksumming the item whole.
class BlockChecksums {
 public:
  explicit BlockChecksums(uint64_t block) : block_(block) {}
  void update(const uint8_t* data, uint64_t n) {
    while (n > 0) {
      if (!hash_) hash_ = std::make_unique<io::StreamingHash>();
      const uint64_t take = std::min(n, block_ - filled_);
      hash_->update(data, take);
      filled_ += take;
      data += take;
      n -= take;
      if (filled_ == block_) finish_block();
    }
  }
  std::vector<uint64_t> finish() {
    if (filled_ > 0) finish_block();
    return std::move(blocks_);
  }

 private:
  void finish_block() {
    blocks_.push_back(hash_->digest());
    hash_.reset();
    filled_ = 0;
  }

  const uint64_t block_;
  std::unique_ptr<io::StreamingHash> hash_;
  uint64_t filled_ = 0;
  std::vector<uint64_t> blocks_;
};

namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

StreamedSave::StreamedSave(const StateDict& state_dict, const std::string& dir, const SaveOptions& options)
    : comm_(make_single_process_communicator()) {
  if (options.format != StorageFormat::distckpt() && options.format != StorageFormat::detected())
    throw UsageError("a streamed save writes the distckpt format only");
  prepared_ = prepare_save(state_dict, dir, *comm_, options);
  try {
    lay_out();
  } catch (...) {
    discard();  // a failed save leaves nothing behind
    throw;
  }
}

void StreamedSave::lay_out() {
  const PreparedSave& p = *prepared_;
  for (const uint32_t i : p.assignment) {
    if (i >= p.tensors.size()) throw UsageError("a streamed save writes tensors only, not sharded objects");
    const ShardedTensor& t = *p.tensors[i];
    if (t.flattened_range || t.local_shape != t.global_shape) {
      throw UsageError(fmt::format("a streamed save writes whole tensors; {} is a shard", t.describe()));
    }
    keys_.push_back(t.key);
    offsets_.push_back(file_size_);
    lengths_.push_back(static_cast<uint64_t>(t.held_numel()) * dtype_size(p.stored_dtypes[i]));
    payload_ += lengths_.back();
    // The layout FileWriteJob gives: every item at an aligned offset.
    file_size_ = align_up(file_size_ + lengths_.back(), io::File::kDirectAlignment);
    if (p.options.checksum_block_size != 0) {
      checksums_.push_back(std::make_unique<BlockChecksums>(p.options.checksum_block_size));
    }
  }
  written_.assign(keys_.size(), 0);
  blocks_.resize(keys_.size());
  if (keys_.empty()) return;  // no data file, as save() writes none
  sink_ = p.distckpt->data_sink(file_size_);
}

StreamedSave::~StreamedSave() {
  if (!committed_) discard();
}

void StreamedSave::discard() noexcept {
  if (!prepared_ || !prepared_->claimed) return;  // finalize_save discarded it already
  if (sink_) sink_->abort();                      // closed before its directory goes
  sink_.reset();
  prepared_->writer->discard();
  prepared_->claimed = false;
}

void StreamedSave::write(size_t index, uint64_t offset, const void* data, uint64_t n) {
  if (index >= keys_.size() || offset != written_[index] || n > lengths_[index] - offset) {
    throw UsageError(fmt::format("streamed save: bytes [{}, {}) of tensor {} arrive out of order or past its end",
                                 offset, offset + n, index));
  }
  sink_->write_at(offsets_[index] + offset, static_cast<const uint8_t*>(data), n);
  written_[index] += n;
  if (n > 0 && written_[index] == lengths_[index]) {
    // The padding to the next item, written: an object's part is sent only
    // once every byte of it arrived.
    static const std::vector<uint8_t> zeros(io::File::kDirectAlignment, 0);
    const uint64_t end = offsets_[index] + lengths_[index];
    const uint64_t padding = align_up(end, io::File::kDirectAlignment) - end;
    if (padding > 0) sink_->write_at(end, zeros.data(), padding);
  }
  if (!checksums_.empty() && checksums_[index]) {
    checksums_[index]->update(static_cast<const uint8_t*>(data), n);
    // Done now, not at commit: a tensor's unfinished hash state is 576
    // bytes, held for every small tensor otherwise.
    if (n > 0 && written_[index] == lengths_[index]) {
      blocks_[index] = checksums_[index]->finish();
      checksums_[index].reset();
    }
  }
}

SaveReport StreamedSave::commit() {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (written_[i] != lengths_[i]) {
      throw UsageError(fmt::format("streamed save: '{}' has {} of its {} bytes", keys_[i], written_[i], lengths_[i]));
    }
  }
  const SaveReport report = finalize_save(
      *prepared_,
      [&] {
        io::FileWritten written;
        written.file_size = file_size_;
        for (size_t i = 0; i < keys_.size(); ++i) {
          written.items.push_back({offsets_[i], lengths_[i], std::move(blocks_[i])});  // none for an empty tensor
        }
        if (sink_) sink_->finish(file_size_);
        return RankWritten{prepared_->distckpt->encode_written(written), keys_.size(), payload_};
      },
      *comm_);
  committed_ = true;
  return report;
}

}  // namespace distckpt::saving
