// Whole-checkpoint conversions: any readable checkpoint to safetensors
// (streamed in windows); any checkpoint or torch.save file to torch.save or
// to distckpt (whole tensors, one rank saves everything).
#include "distckpt/api/convert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <string_view>
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

constexpr uint64_t kWindowBytes = uint64_t{32} << 20;

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

std::vector<Export> every_tensor(api::CheckpointReader& reader) {
  std::vector<Export> out;
  for (const TensorRecord& t : reader.index().tensors) {
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

// A torch.save file's tensors (held at once, as torch.load holds them).
ConvertReport torch_file_to_safetensors(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  if (!options.mapping.empty()) throw Error("a torch.save file records no name mappings; export it without --map");
  api::TorchFileContents contents = api::read_torch_file(src);
  ConvertReport report;
  const api::NamedTensors tensors = converted_tensors(contents, src, options, report);
  std::vector<safetensors::Entry> entries;
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    entries.push_back({name, t.scalar_type(), t.sizes().vec(), 0, 0});
    by_name.emplace(name, &t);
  }
  storage::SafetensorsWriter writer(dst, std::move(entries), options.max_shard_bytes, {{"format", "pt"}});
  for (size_t i = 0; i < writer.tensors().size(); ++i) {
    const at::Tensor t = by_name.at(writer.tensors()[i].name)->contiguous();
    writer.write(i, 0, t.data_ptr(), t.nbytes());
  }
  writer.commit();
  report.files = writer.files();
  if (options.progress) options.progress(report.bytes, report.bytes);
  return report;
}

}  // namespace

ConvertReport convert_to_safetensors(const std::string& src, const std::string& dst, const ConvertOptions& options) {
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
  for (size_t i = 0; i < writer.tensors().size(); ++i) {
    const safetensors::Entry& entry = writer.tensors()[i];
    const Export& e = *by_name.at(entry.name);
    const uint64_t element = dtype_size(entry.dtype);
    api::read_in_windows(reader, *e.record, e.region, kWindowBytes, [&](int64_t start, const at::Tensor& values) {
      const at::Tensor out = values.scalar_type() == entry.dtype ? values : values.to(entry.dtype);
      writer.write(i, static_cast<uint64_t>(start) * element, out.data_ptr(), out.nbytes());
      report.peak_buffer = std::max<uint64_t>(
          report.peak_buffer, values.nbytes() + (out.data_ptr() == values.data_ptr() ? 0 : out.nbytes()));
      progress.add(out.nbytes());
    });
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
