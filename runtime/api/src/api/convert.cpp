// Whole-checkpoint conversions: any readable checkpoint or torch.save file
// to safetensors, to torch.save or to distckpt (whole tensors, as one rank
// saves them). Every export streams its tensors through bounded windows.
#include "distckpt/api/convert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "distckpt/api/checkpoint.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/dcp.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "io/file.h"
#include "io/threads.h"
#include "load/checkpoint_reader.h"
#include "save/streamed_save.h"
#include "storage/safetensors_writer.h"
#include "storage/torch_file_reader.h"
#include "storage/torch_file_writer.h"

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

// What a conversion writes: a directory may exist empty (made with mkdir first).
enum class Target { kFile, kDirectory };

// The checks of the conversions that write one whole target.
void check_whole_target(const std::string& dst, const ConvertOptions& options, Target target) {
  const bool taken = is_object_store(dst)           ? location_exists(dst)
                     : target == Target::kDirectory ? !io::holds_nothing(dst)
                                                    : io::lexists(dst);  // a dangling link too
  if (taken) {
    throw CheckpointError(
        fmt::format("'{}' already exists; remove it or choose another destination (nothing was written)", dst));
  }
  if (options.max_shard_bytes != 0) throw Error("max_shard_bytes applies to safetensors only");
  if (!options.mapping.empty() || options.name_mapping) {
    throw Error("a name mapping applies to the export to safetensors only");
  }
}

// One tensor of the export: its name, the stored tensor and the region of it.
struct Export {
  std::string name;
  const TensorRecord* record;
  Box region;
  Shape shape;  // as exported: the region's lengths without leading stacked axes
};

void check_convertible(const loading::CheckpointReader& reader, const TensorRecord& t) {
  if (t.unrepresentable) {
    throw CheckpointError(
        fmt::format("'{}' in '{}' cannot be converted: {}", t.key, reader.dir(), unrepresentable_reason(t)));
  }
}

std::vector<Export> every_tensor(loading::CheckpointReader& reader) {
  std::vector<Export> out;
  for (const TensorRecord& t : reader.index().tensors) {
    check_convertible(reader, t);
    out.push_back({t.key, &t, Box{Shape(t.global_shape.size(), 0), t.global_shape}, t.global_shape});
  }
  return out;
}

// The external tensors of `mapping`.
std::vector<Export> mapped(loading::CheckpointReader& reader, const NameMapping& mapping) {
  const std::string& name = mapping.name();
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
// window overlaps writing this one. Windows are written in the order they
// are pushed; pieces of small tensors share one window (a hand-over per
// tensor, thread wake-ups included, cost more than writing a small tensor).
// One window waits at most, so three buffers circulate (filled, waiting,
// being written); they are recycled, not freed: large buffers freed and
// allocated again make the C allocator keep hundreds of MiB resident.
// Memory: the reader's window and these three.
class WindowWriter {
 public:
  using Sink = std::function<void(size_t index, uint64_t offset, const void* data, uint64_t n)>;
  WindowWriter(Sink sink, Progress& progress, uint64_t window_bytes)
      : sink_(std::move(sink)),
        progress_(progress),
        window_bytes_(window_bytes),
        thread_(io::start_thread([this] { run(); }, "writing the converted file")) {}
  ~WindowWriter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      changed_.notify_all();
    }
    thread_.join();
  }

  // Room for bytes [offset, offset + n) of tensor `index` in the open
  // window, to fill before filled(); a window without that room is handed
  // over first (blocking while one waits).
  uint8_t* reserve(size_t index, uint64_t offset, uint64_t n) {
    const auto aligned = [&] { return (open_.used + 63) / 64 * 64; };  // every piece aligned for its dtype
    if (open_.buffer.defined() && aligned() + n > static_cast<uint64_t>(open_.buffer.nbytes())) flush();
    if (!open_.buffer.defined()) open_.buffer = take_buffer(n);
    const uint64_t start = aligned();
    open_.segments.push_back({index, offset, start, n});
    open_.used = start + n;
    return static_cast<uint8_t*>(open_.buffer.data_ptr()) + start;
  }
  // The reserved room is filled: a window half full goes to the writer now
  // (a large tensor's windows one by one, as they are read).
  void filled() {
    if (2 * open_.used >= static_cast<uint64_t>(open_.buffer.nbytes())) flush();
  }
  // Hands the open window over.
  void flush() {
    if (open_.segments.empty()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !waiting_ || error_; });
    if (error_) std::rethrow_exception(error_);
    waiting_ = std::move(open_);
    open_ = Window{};
    changed_.notify_all();
  }
  // Waits for every write; rethrows the first error. Returns the bytes of
  // every buffer allocated.
  uint64_t finish() {
    flush();
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return (!waiting_ && !writing_) || error_; });
    if (error_) std::rethrow_exception(error_);
    return allocated_;
  }

 private:
  struct Segment {
    size_t index;
    uint64_t offset;  // in the tensor
    uint64_t at;      // in the buffer
    uint64_t bytes;
  };
  struct Window {
    at::Tensor buffer;
    std::vector<Segment> segments;
    uint64_t used = 0;
  };

  // A recycled buffer of at least `bytes` (a window's, or more for one
  // large converted piece).
  at::Tensor take_buffer(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (static_cast<uint64_t>(it->nbytes()) >= bytes) {
        at::Tensor b = std::move(*it);
        free_.erase(it);
        return b;
      }
    }
    const uint64_t capacity = std::max(bytes, window_bytes_);
    allocated_ += capacity;
    return at::empty({static_cast<int64_t>(capacity)}, at::TensorOptions().dtype(at::kByte));
  }

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
        const auto* base = static_cast<const uint8_t*>(w.buffer.data_ptr());
        for (const Segment& s : w.segments) {
          sink_(s.index, s.offset, base + s.at, s.bytes);
          progress_.add(s.bytes);
        }
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

  const Sink sink_;
  Progress& progress_;
  const uint64_t window_bytes_;
  Window open_;  // being filled, by the reading thread only
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Window> waiting_;
  std::vector<at::Tensor> free_;
  bool writing_ = false, stopping_ = false;
  uint64_t allocated_ = 0;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

// Copies one read window of tensor `index` (element `first` on) into the
// writer's open window, converted to `dtype`: the read window is reused at
// once.
void push_window(WindowWriter& windows, size_t index, at::ScalarType dtype, int64_t first, const at::Tensor& values) {
  const uint64_t element = dtype_size(dtype);
  const uint64_t bytes = static_cast<uint64_t>(values.numel()) * element;
  uint8_t* dst = windows.reserve(index, static_cast<uint64_t>(first) * element, bytes);
  if (bytes > 0) at::from_blob(dst, {values.numel()}, at::TensorOptions().dtype(dtype)).copy_(values.reshape(-1));
  windows.filled();
}

using WindowFn = std::function<void(int64_t first, const at::Tensor& values)>;

// The tensors an export writes, each read in windows: a checkpoint's (any
// load() reads) or a torch.save file's.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  struct Tensor {
    std::string name;
    at::ScalarType dtype;
    Shape shape;
  };
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // Tensor i's values in row-major windows of at most `scratch`'s bytes.
  virtual void read(size_t i, const at::Tensor& scratch, const WindowFn& fn) = 0;
  // Bytes held beyond the windows (a strided view's storage, read whole).
  uint64_t extra_peak() const { return extra_peak_; }
  // SaveOptions::content_metadata of a distckpt source, kept by the
  // conversion to distckpt. (A safetensors file's "format" describes those
  // files only: it does not travel.)
  virtual std::optional<StateDict> content_metadata() { return std::nullopt; }

 protected:
  std::vector<Tensor> tensors_;
  uint64_t extra_peak_ = 0;
};

class CheckpointSource : public TensorSource {
 public:
  CheckpointSource(const std::string& src, const ConvertOptions& options) : reader_(src) {
    if (!options.mapping.empty() && options.name_mapping) {
      throw UsageError("ConvertOptions: give a recorded mapping's name or a mapping, not both");
    }
    if (options.name_mapping) {
      exports_ = mapped(reader_, *options.name_mapping);
    } else if (!options.mapping.empty()) {
      const std::vector<NameMapping> recorded = reader_.storage().name_mappings();
      exports_ = mapped(reader_, find_mapping(recorded, options.mapping, fmt::format("checkpoint '{}'", src)));
    } else {
      exports_ = every_tensor(reader_);
    }
    for (const Export& e : exports_) tensors_.push_back({e.name, e.record->dtype, e.shape});
    if (!reader_.index().objects.empty()) {
      log_message(LogLevel::kWarning, fmt::format("{} sharded objects of '{}' are not exported (tensors only)",
                                                  reader_.index().objects.size(), src));
    }
  }
  std::optional<StateDict> content_metadata() override {
    if (reader_.storage().format() != StorageFormat::distckpt()) return std::nullopt;
    return reader_.storage().read_content_metadata();
  }
  void read(size_t i, const at::Tensor& scratch, const WindowFn& fn) override {
    loading::read_in_windows(reader_, *exports_[i].record, exports_[i].region, scratch.nbytes(), fn, scratch);
  }

 private:
  loading::CheckpointReader reader_;
  std::vector<Export> exports_;
};

// A contiguous tensor streams from the file; a strided view (rare in a
// state dict) reads its storage whole.
class TorchFileSource : public TensorSource {
 public:
  explicit TorchFileSource(const std::string& src) : reader_(src) {
    for (const auto& [name, layout] : reader_.tensors())
      tensors_.push_back({name, layout.scalar_type(), layout.sizes().vec()});
  }
  void read(size_t i, const at::Tensor& scratch, const WindowFn& fn) override {
    if (reader_.contiguous(i)) return reader_.read_in_windows(i, scratch, fn);
    const at::Tensor whole = reader_.read(i).contiguous();
    extra_peak_ = std::max<uint64_t>(extra_peak_, whole.storage().nbytes() + whole.nbytes());
    const at::Tensor flat = whole.view(-1);
    const int64_t window = std::max<int64_t>(1, static_cast<int64_t>(scratch.nbytes() / whole.element_size()));
    for (int64_t first = 0; first < flat.numel(); first += window) {
      fn(first, flat.narrow(0, first, std::min(window, flat.numel() - first)));
    }
  }
  const StateDict& common() const { return reader_.common(); }

 private:
  storage::TorchFileReader reader_;
};

std::unique_ptr<TensorSource> open_source(const std::string& src, const ConvertOptions& options) {
  if (options.window_bytes == 0) throw Error("ConvertOptions::window_bytes must be positive");
  if (storage::is_torch_file(src)) {
    if (!options.mapping.empty() || options.name_mapping) {
      throw Error("a torch.save file's tensors are named by their dotted paths; export it without a name mapping");
    }
    return std::make_unique<TorchFileSource>(src);
  }
  return std::make_unique<CheckpointSource>(src, options);
}

// Streams every tensor of `source` to `sink` in the order of `order`
// (indices into source.tensors()), converted to `dtypes` (by that order).
// Returns the bytes of buffer held at most.
uint64_t stream(TensorSource& source, const std::vector<size_t>& order, const std::vector<at::ScalarType>& dtypes,
                WindowWriter::Sink sink, Progress& progress, const ConvertOptions& options) {
  WindowWriter windows(std::move(sink), progress, options.window_bytes);
  const at::Tensor scratch = at::empty({static_cast<int64_t>(options.window_bytes)}, at::kByte);  // read windows
  for (size_t k = 0; k < order.size(); ++k) {
    source.read(order[k], scratch,
                [&](int64_t first, const at::Tensor& values) { push_window(windows, k, dtypes[k], first, values); });
  }
  return scratch.nbytes() + windows.finish() + source.extra_peak();
}

// stream() into `writer` (its write(index, offset, data, n) takes indices
// into `order`), reporting progress against its total bytes.
template <typename Writer>
uint64_t stream_into(Writer& writer, TensorSource& source, const std::vector<size_t>& order,
                     const std::vector<at::ScalarType>& dtypes, const ConvertOptions& options) {
  Progress progress(options, writer.bytes());
  return stream(
      source, order, dtypes,
      [&](size_t i, uint64_t offset, const void* data, uint64_t n) { writer.write(i, offset, data, n); }, progress,
      options);
}

// SRC's common values, none of which may share a tensor's name.
StateDict common_values(const TensorSource& source, const std::string& src) {
  const auto* torch_file = dynamic_cast<const TorchFileSource*>(&source);
  StateDict common = torch_file ? torch_file->common() : load_common_state_dict(src);
  for (const TensorSource::Tensor& t : source.tensors()) {
    if (common.contains(t.name)) {
      throw CheckpointError(fmt::format("'{}' names both a tensor and a common value in '{}'", t.name, src));
    }
  }
  return common;
}

}  // namespace

ConvertReport convert_to_safetensors(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  const std::unique_ptr<TensorSource> source = open_source(src, options);
  std::vector<safetensors::Entry> entries;
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < source->tensors().size(); ++i) {
    const TensorSource::Tensor& t = source->tensors()[i];
    entries.push_back({t.name, stored_dtype(t.dtype, options), t.shape, 0, 0});
    if (!by_name.emplace(t.name, i).second)
      throw CheckpointError(fmt::format("'{}' names two tensors of '{}'", t.name, src));
  }
  storage::SafetensorsWriter writer(dst, std::move(entries), options.max_shard_bytes,
                                    {{safetensors::kFormatKey, "pt"}});
  std::vector<size_t> order;  // the writer's: by dtype width, then name
  std::vector<at::ScalarType> dtypes;
  for (const safetensors::Entry& e : writer.tensors()) {
    order.push_back(by_name.at(e.name));
    dtypes.push_back(e.dtype);
  }
  ConvertReport report;
  report.peak_buffer = stream_into(writer, *source, order, dtypes, options);
  writer.commit();
  report.tensors = writer.tensors().size();
  report.files = writer.files();
  report.bytes = writer.bytes();
  return report;
}

ConvertReport convert_to_torch(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  if (is_object_store(dst)) {
    throw UsageError(
        fmt::format("a torch.save file is written to a local path, not '{}'; convert to distckpt or "
                    "safetensors there, or copy the file up afterwards",
                    dst));
  }
  check_whole_target(dst, options, Target::kFile);
  const std::unique_ptr<TensorSource> source = open_source(src, options);
  const StateDict common = common_values(*source, src);
  std::vector<storage::TorchFileWriter::Tensor> tensors;
  std::vector<size_t> order;
  std::vector<at::ScalarType> dtypes;
  for (size_t i = 0; i < source->tensors().size(); ++i) {
    const TensorSource::Tensor& t = source->tensors()[i];
    tensors.push_back({t.name, stored_dtype(t.dtype, options), t.shape});
    order.push_back(i);
    dtypes.push_back(tensors.back().dtype);
  }
  storage::TorchFileWriter writer(dst, common, std::move(tensors));
  ConvertReport report;
  report.peak_buffer = stream_into(writer, *source, order, dtypes, options);
  writer.commit();
  report.tensors = writer.tensors().size();
  report.files = 1;
  report.bytes = writer.bytes();
  return report;
}

ConvertReport convert_to_distckpt(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  check_whole_target(dst, options, Target::kDirectory);
  const std::unique_ptr<TensorSource> source = open_source(src, options);
  StateDict state = common_values(*source, src);
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < source->tensors().size(); ++i) {
    const TensorSource::Tensor& t = source->tensors()[i];
    if (t.name.empty()) {
      throw CheckpointError(
          fmt::format("'{}' holds a tensor with an empty name, which a distckpt checkpoint cannot store (its keys name "
                      "tensors); convert it --to safetensors or --to torch instead (nothing was written)",
                      src));
    }
    // Shape and dtype only: the values stream from SRC into the data file.
    const at::Tensor meta =
        at::empty(t.shape, at::TensorOptions().dtype(stored_dtype(t.dtype, options)).device(at::kMeta));
    state[t.name] = ShardedTensor::from_rank_offsets(t.name, meta, {});
    by_name.emplace(t.name, i);
  }
  SaveOptions save_options;
  save_options.content_metadata = source->content_metadata();
  saving::StreamedSave save(state, dst, save_options);
  std::vector<size_t> order;  // the data file's
  std::vector<at::ScalarType> dtypes;
  for (const std::string& key : save.keys()) {
    order.push_back(by_name.at(key));
    dtypes.push_back(stored_dtype(source->tensors()[order.back()].dtype, options));
  }
  ConvertReport report;
  report.peak_buffer = stream_into(save, *source, order, dtypes, options);
  save.commit();
  report.tensors = source->tensors().size();  // an empty one has no bytes in the file
  report.files = order.empty() ? 0 : 1;
  report.bytes = save.bytes();
  return report;
}

ConvertReport convert_to_dcp(const std::string& src, const std::string& dst, const DcpWriteOptions& dcp,
                             const ConvertOptions& options) {
  check_whole_target(dst, options, Target::kDirectory);
  const std::unique_ptr<TensorSource> source = open_source(src, options);
  const StateDict common = common_values(*source, src);
  SaveContents contents;
  contents.common = &common;
  uint64_t total = 0;
  for (const TensorSource::Tensor& t : source->tensors()) {
    contents.tensors.push_back({t.name, stored_dtype(t.dtype, options), t.shape});
    total += static_cast<uint64_t>(numel(t.shape)) * dtype_size(contents.tensors.back().dtype);
  }
  const std::unique_ptr<StorageWriter> writer = make_dcp_writer(dst, dcp);
  ConvertReport report;
  try {
    writer->claim();
    writer->prepare(contents);
    // Each tensor goes out in blocks of whole rows of at most a window (one
    // row when a row is larger), each block an item; a file takes blocks
    // until it holds four windows' worth, so memory stays a few windows.
    std::string written;
    std::vector<SavePiece> batch;
    uint64_t batch_bytes = 0;
    const auto flush = [&] {
      written += writer->write(0, std::move(batch));
      batch.clear();
      batch_bytes = 0;
      ++report.files;
    };
    Progress progress(options, total);
    const at::Tensor scratch = at::empty({static_cast<int64_t>(options.window_bytes)}, at::kByte);
    for (size_t i = 0; i < source->tensors().size(); ++i) {
      const SaveTensor& t = contents.tensors[i];
      const uint64_t element = dtype_size(t.dtype);
      const int64_t rows = t.global_shape.empty() ? 1 : t.global_shape[0];
      const int64_t per_row = t.global_shape.empty() ? 1 : numel(t.global_shape) / std::max<int64_t>(rows, 1);
      const int64_t block_rows =
          std::max<int64_t>(1, static_cast<int64_t>(options.window_bytes / std::max<uint64_t>(1, per_row * element)));
      at::Tensor block;
      int64_t block_first = 0, filled = 0;  // the block's first row; elements in it so far
      const auto emit = [&](int64_t block_row_count) {
        Shape offset(t.global_shape.size(), 0), length = t.global_shape;
        if (!t.global_shape.empty()) {
          offset[0] = block_first;
          length[0] = block_row_count;
        }
        batch.push_back(SavePiece{t.key, t.global_shape, Box{offset, length}, std::nullopt, block, nullptr});
        batch_bytes += block.nbytes();
        report.bytes += block.nbytes();
        progress.add(block.nbytes());
        if (batch_bytes >= 4 * options.window_bytes) flush();
        block_first += block_row_count;
        filled = 0;
        block = at::Tensor();
      };
      source->read(i, scratch, [&](int64_t, const at::Tensor& values) {
        const at::Tensor flat = values.reshape(-1);
        for (int64_t at = 0; at < flat.numel();) {
          if (!block.defined()) {
            const int64_t n = std::min(block_rows, rows - block_first);
            Shape shape = t.global_shape;
            if (!shape.empty()) shape[0] = n;
            block = at::empty(shape, at::TensorOptions().dtype(t.dtype));
          }
          const int64_t take = std::min(flat.numel() - at, block.numel() - filled);
          block.view({-1}).narrow(0, filled, take).copy_(flat.narrow(0, at, take));
          filled += take;
          at += take;
          if (filled == block.numel()) emit(t.global_shape.empty() ? 1 : block.size(0));
        }
      });
      if (block.defined() && filled > 0) {
        throw CheckpointError(fmt::format("'{}' in '{}' ended early while converting", t.key, src));
      }
    }
    if (!batch.empty() || report.files == 0) flush();
    writer->commit({written});
  } catch (...) {
    writer->discard();
    throw;
  }
  report.tensors = source->tensors().size();
  return report;
}

}  // namespace distckpt
