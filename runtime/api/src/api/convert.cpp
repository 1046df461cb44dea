// Whole-checkpoint conversions: any readable checkpoint or torch.save file
// to safetensors (streamed in windows); any of them to torch.save or to
// distckpt (whole tensors, one rank saves everything).
#include "distckpt/api/convert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/checkpoint_reader.h"
#include "api/torch_file.h"
#include "distckpt/api/checkpoint.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "format/dtype.h"
#include "io/file.h"
#include "storage/safetensors_writer.h"

namespace distckpt {
namespace {

at::ScalarType stored_dtype(at::ScalarType dtype, const ConvertOptions& options) {
  if (!options.dtype) return dtype;
  if (!at::isFloatingType(*options.dtype)) {
    throw Error(
        fmt::format("the conversion dtype must be a floating-point type, not {}; integer and bool tensors "
                    "always keep theirs",
                    dtype_name(*options.dtype)));
  }
  return at::isFloatingType(dtype) ? *options.dtype : dtype;
}

// Calls `progress` at most every 250 ms, and once at the end.
class Progress {
 public:
  Progress(const ConvertOptions& options, uint64_t total) : progress_(options.progress), total_(total) {}
  void add(uint64_t bytes) {
    done_ += bytes;
    if (!progress_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(250) && done_ != total_) return;
    last_ = now;
    progress_(done_, total_);
  }

 private:
  const std::function<void(uint64_t, uint64_t)>& progress_;
  uint64_t total_;
  uint64_t done_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

// The checks of the conversions that write one whole target.
void check_whole_target(const std::string& dst, const ConvertOptions& options) {
  if (io::exists(dst)) {
    throw CheckpointError(
        fmt::format("'{}' already exists; remove it or choose another destination (nothing was written)", dst));
  }
  if (options.max_shard_bytes != 0) throw Error("max_shard_bytes applies to safetensors only");
  if (!options.mapping.empty()) throw Error("a name mapping applies to the export to safetensors only");
}

// SRC's tensors, whole, and its common values: a torch.save file, or any
// checkpoint load() reads. All tensors are held at once.
api::TorchFileContents whole_contents(const std::string& src) {
  if (api::is_torch_file(src)) return api::read_torch_file(src);
  api::TorchFileContents contents;
  contents.common = load_common_state_dict(src);
  for (auto& [key, value] : load_plain_tensors(src).as_dict()) contents.tensors.emplace_back(key, value.as_tensor());
  return contents;
}

// `contents`' tensors in their converted dtype; a key that is also a common
// value is an error. Counts into `report`.
api::NamedTensors converted_tensors(api::TorchFileContents& contents, const std::string& src,
                                    const ConvertOptions& options, ConvertReport& report) {
  api::NamedTensors out;
  for (auto& [key, tensor] : contents.tensors) {
    if (contents.common.contains(key)) {
      throw CheckpointError(fmt::format("'{}' names both a tensor and a common value in '{}'", key, src));
    }
    const at::ScalarType dtype = stored_dtype(tensor.scalar_type(), options);
    at::Tensor t = dtype == tensor.scalar_type() ? tensor : tensor.to(dtype);
    report.bytes += t.nbytes();
    ++report.tensors;
    out.emplace_back(key, std::move(t));
  }
  contents.tensors.clear();
  report.peak_buffer = report.bytes;
  report.files = 1;
  return out;
}

// One tensor of the export: its name, the stored tensor and the region of it.
struct Export {
  std::string name;
  const TensorRecord* record;
  Box region;
  Shape shape;  // as exported: the region's lengths without leading stacked axes
};

void check_convertible(const api::CheckpointReader& reader, const TensorRecord& t) {
  if (t.unrepresentable) {
    throw CheckpointError(
        fmt::format("'{}' in '{}' cannot be converted: {}", t.key, reader.dir(), unrepresentable_reason(t)));
  }
}

std::vector<Export> every_tensor(api::CheckpointReader& reader) {
  std::vector<Export> out;
  for (const TensorRecord& t : reader.index().tensors) {
    check_convertible(reader, t);
    out.push_back({t.key, &t, Box{Shape(t.global_shape.size(), 0), t.global_shape}, t.global_shape});
  }
  return out;
}

// The external tensors of the mapping `name` recorded in the checkpoint.
std::vector<Export> mapped(api::CheckpointReader& reader, const std::string& name) {
  const std::vector<NameMapping> recorded = reader.storage().name_mappings();
  const NameMapping& mapping = find_mapping(recorded, name, fmt::format("checkpoint '{}'", reader.dir()));
  std::vector<Export> out;
  for (MappedName& n : mapping.expand()) {
    const TensorRecord& record = reader.tensor(n.key);
    check_convertible(reader, record);
    if (n.key_pad_dim >= 0 && record.global_shape.size() == n.key_shape.size()) {
      n.take_pad_extent(record.global_shape[static_cast<size_t>(n.key_pad_dim)]);  // padded rows exported as stored
    }
    if (record.global_shape != n.key_shape) {
      throw CheckpointError(fmt::format("'{}' in '{}' has shape {}, but name mapping '{}' expects {} (for '{}')", n.key,
                                        reader.dir(), to_string(record.global_shape), name, to_string(n.key_shape),
                                        n.external));
    }
    out.push_back({n.external, &record, n.region, n.external_shape()});
  }
  return out;
}

// The export's writes, on a thread of their own, so that reading the next
// window overlaps writing this one. One window waits at most, so three
// buffers circulate (filled, waiting, being written); they are recycled, not
// freed: large buffers freed and allocated again make the C allocator keep
// hundreds of MiB resident. Memory: the reader's window and these three.
class WindowWriter {
 public:
  WindowWriter(storage::SafetensorsWriter& writer, Progress& progress, uint64_t window_bytes)
      : writer_(writer), progress_(progress), window_bytes_(window_bytes), thread_([this] { run(); }) {}
  ~WindowWriter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      changed_.notify_all();
    }
    thread_.join();
  }

  // A buffer of at least `bytes` to fill and push().
  at::Tensor buffer(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->nbytes() >= bytes) {
        at::Tensor b = std::move(*it);
        free_.erase(it);
        return b;
      }
    }
    const uint64_t capacity = std::max(bytes, window_bytes_);
    allocated_ += capacity;
    return at::empty({static_cast<int64_t>(capacity)}, at::TensorOptions().dtype(at::kByte));
  }
  // Writes bytes [0, n) of `buffer` at `offset` of tensor `index`; blocks
  // while a window waits.
  void push(size_t index, uint64_t offset, at::Tensor buffer, uint64_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !waiting_ || error_; });
    if (error_) std::rethrow_exception(error_);
    waiting_ = Window{index, offset, std::move(buffer), n};
    changed_.notify_all();
  }
  // Waits for every write; rethrows the first error. Returns the bytes of
  // every buffer allocated.
  uint64_t finish() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return (!waiting_ && !writing_) || error_; });
    if (error_) std::rethrow_exception(error_);
    return allocated_;
  }

 private:
  struct Window {
    size_t index;
    uint64_t offset;
    at::Tensor buffer;
    uint64_t bytes;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return waiting_ || stopping_; });
      if (!waiting_) return;
      Window w = std::move(*waiting_);
      waiting_.reset();
      writing_ = true;
      changed_.notify_all();
      lock.unlock();
      std::exception_ptr error;
      try {
        writer_.write(w.index, w.offset, w.buffer.data_ptr(), w.bytes);
        progress_.add(w.bytes);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      writing_ = false;
      if (free_.size() < 3) free_.push_back(std::move(w.buffer));
      if (error && !error_) error_ = error;
      changed_.notify_all();
    }
  }

  storage::SafetensorsWriter& writer_;
  Progress& progress_;
  const uint64_t window_bytes_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Window> waiting_;
  std::vector<at::Tensor> free_;
  bool writing_ = false, stopping_ = false;
  uint64_t allocated_ = 0;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

// Pushes one read window of tensor `index` (element `first` on) to the
// writer, converted to the entry's dtype in a buffer of the writer's: the
// read window is reused at once.
void push_window(WindowWriter& windows, size_t index, const safetensors::Entry& entry, int64_t first,
                 const at::Tensor& values) {
  const uint64_t element = dtype_size(entry.dtype);
  const uint64_t bytes = static_cast<uint64_t>(values.numel()) * element;
  at::Tensor buffer = windows.buffer(bytes);
  if (bytes > 0) buffer.narrow(0, 0, static_cast<int64_t>(bytes)).view(entry.dtype).copy_(values);
  windows.push(index, static_cast<uint64_t>(first) * element, std::move(buffer), bytes);
}

// A torch.save file's tensors, streamed like a checkpoint's: a contiguous
// tensor goes from the file through the read window; a strided view (rare in
// state dicts) reads its storage whole, once per view.
ConvertReport torch_file_to_safetensors(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  if (!options.mapping.empty()) throw Error("a torch.save file records no name mappings; export it without --map");
  api::TorchFileReader reader(src);
  std::vector<safetensors::Entry> entries;
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < reader.tensors().size(); ++i) {
    const auto& [name, layout] = reader.tensors()[i];
    if (reader.common().contains(name)) {
      throw CheckpointError(fmt::format("'{}' names both a tensor and a common value in '{}'", name, src));
    }
    entries.push_back({name, stored_dtype(layout.scalar_type(), options), layout.sizes().vec(), 0, 0});
    by_name.emplace(name, i);
  }
  storage::SafetensorsWriter writer(dst, std::move(entries), options.max_shard_bytes, {{"format", "pt"}});
  ConvertReport report;
  Progress progress(options, writer.bytes());
  uint64_t largest_view = 0;
  {
    WindowWriter windows(writer, progress, options.window_bytes);
    const at::Tensor scratch = at::empty({static_cast<int64_t>(options.window_bytes)}, at::kByte);
    for (size_t i = 0; i < writer.tensors().size(); ++i) {
      const safetensors::Entry& entry = writer.tensors()[i];
      const size_t t = by_name.at(entry.name);
      const auto push = [&](int64_t first, const at::Tensor& values) { push_window(windows, i, entry, first, values); };
      if (reader.contiguous(t)) {
        reader.read_in_windows(t, scratch, push);
        continue;
      }
      const at::Tensor whole = reader.read(t).contiguous();
      largest_view = std::max<uint64_t>(largest_view, whole.storage().nbytes() + whole.nbytes());
      const int64_t window = std::max<int64_t>(1, static_cast<int64_t>(options.window_bytes / whole.element_size()));
      const at::Tensor flat = whole.view(-1);
      for (int64_t first = 0; first < flat.numel(); first += window) {
        push(first, flat.narrow(0, first, std::min(window, flat.numel() - first)));
      }
    }
    report.peak_buffer = scratch.nbytes() + windows.finish() + largest_view;
  }
  writer.commit();
  report.tensors = writer.tensors().size();
  report.files = writer.files();
  report.bytes = writer.bytes();
  return report;
}

}  // namespace

ConvertReport convert_to_safetensors(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  if (options.window_bytes == 0) throw Error("ConvertOptions::window_bytes must be positive");
  if (api::is_torch_file(src)) return torch_file_to_safetensors(src, dst, options);
  api::CheckpointReader reader(src);
  const std::vector<Export> exports = options.mapping.empty() ? every_tensor(reader) : mapped(reader, options.mapping);
  std::vector<safetensors::Entry> entries;
  std::unordered_map<std::string, const Export*> by_name;
  for (const Export& e : exports) {
    entries.push_back({e.name, stored_dtype(e.record->dtype, options), e.shape, 0, 0});
    by_name.emplace(e.name, &e);
  }
  if (!reader.index().objects.empty()) {
    log_message(LogLevel::kWarning,
                fmt::format("{} sharded objects of '{}' are not exported: safetensors holds tensors "
                            "only",
                            reader.index().objects.size(), src));
  }
  storage::SafetensorsWriter writer(dst, std::move(entries), options.max_shard_bytes, {{"format", "pt"}});
  ConvertReport report;
  Progress progress(options, writer.bytes());
  {
    WindowWriter windows(writer, progress, options.window_bytes);
    const at::Tensor scratch = at::empty({static_cast<int64_t>(options.window_bytes)}, at::kByte);  // read windows
    for (size_t i = 0; i < writer.tensors().size(); ++i) {
      const safetensors::Entry& entry = writer.tensors()[i];
      const Export& e = *by_name.at(entry.name);
      api::read_in_windows(
          reader, *e.record, e.region, options.window_bytes,
          [&](int64_t start, const at::Tensor& values) { push_window(windows, i, entry, start, values); }, scratch);
    }
    report.peak_buffer = scratch.nbytes() + windows.finish();
  }
  writer.commit();
  report.tensors = writer.tensors().size();
  report.files = writer.files();
  report.bytes = writer.bytes();
  return report;
}

ConvertReport convert_to_torch(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  check_whole_target(dst, options);
  api::TorchFileContents contents = whole_contents(src);
  ConvertReport report;
  const api::NamedTensors tensors = converted_tensors(contents, src, options, report);
  api::write_torch_file(dst, contents.common, tensors);
  if (options.progress) options.progress(report.bytes, report.bytes);
  return report;
}

ConvertReport convert_to_distckpt(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  check_whole_target(dst, options);
  api::TorchFileContents contents = whole_contents(src);
  ConvertReport report;
  StateDict state = contents.common;
  // Names are unique within a source: only a common value can collide with one.
  for (auto& [key, t] : converted_tensors(contents, src, options, report)) {
    state[key] = ShardedTensor::from_rank_offsets(key, std::move(t), {});
  }
  const std::shared_ptr<Communicator> one = make_single_process_communicator();
  save(state, dst, *one);
  if (options.progress) options.progress(report.bytes, report.bytes);
  return report;
}

}  // namespace distckpt
