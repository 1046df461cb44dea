// StorageReader's defaults: lookups answered from the whole index, and the
// scattered read (the runs' span in bounded windows, each read and checked with read_chunk, the runs copied out).
#include "distckpt/storage/storage_reader.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace distckpt {

std::optional<size_t> StorageReader::find_tensor(const std::string& key) const {
  const StorageIndex& index = this->index();
  const TensorRecord* record = index.find_tensor(key);
  if (record == nullptr) return std::nullopt;
  return static_cast<size_t>(record - index.tensors.data());
}

size_t StorageReader::lower_bound_tensor(const std::string& key) const {
  const std::vector<TensorRecord>& tensors = index().tensors;
  return static_cast<size_t>(std::lower_bound(tensors.begin(), tensors.end(), key,
                                              [](const TensorRecord& t, const std::string& k) { return t.key < k; }) -
                             tensors.begin());
}

void StorageReader::read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) {
  constexpr uint64_t kWindow = uint64_t{8} << 20;
  std::vector<uint8_t> window;
  for (size_t i = 0; i < runs.size();) {
    // The runs that start within one window from runs[i] (a longer run gets a window of its own size).
    const uint64_t begin = runs[i].offset;
    size_t j = i + 1;
    while (j < runs.size() && runs[j].offset + runs[j].bytes - begin <= kWindow) ++j;
    const uint64_t end = runs[j - 1].offset + runs[j - 1].bytes;
    window.resize(end - begin);
    read_chunk(tensor, chunk, begin, end, window.data());
    for (size_t k = i; k < j; ++k) std::memcpy(runs[k].out, window.data() + (runs[k].offset - begin), runs[k].bytes);
    i = j;
  }
}

}  // namespace distckpt
