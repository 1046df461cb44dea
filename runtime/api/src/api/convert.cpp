// Whole-checkpoint conversions: any readable checkpoint to safetensors
// (streamed in windows) and to distckpt (one rank saves everything).
#include "distckpt/api/convert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <chrono>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "api/checkpoint_reader.h"
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

// A common value as an IValue torch.load turns back into Python objects.
c10::IValue to_ivalue(const Value& v, const std::string& where) {
  switch (v.kind()) {
    case Kind::kNone:
      return c10::IValue();
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int();
    case Kind::kFloat:
      return v.as_float();
    case Kind::kString:
      return v.as_string();
    case Kind::kTensor:
      return v.as_tensor();
    case Kind::kDict: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [key, item] : v.as_dict()) dict.insert(key, to_ivalue(item, where + "." + key));
      return dict;
    }
    case Kind::kList: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (size_t i = 0; i < v.as_list().size(); ++i) list.push_back(to_ivalue(v.as_list()[i], where));
      return list;
    }
    default:
      throw Error(fmt::format("common value '{}' is a {} and has no torch.save form", where, kind_name(v.kind())));
  }
}

// The checks of the conversions that write one whole target.
void check_whole_target(const std::string& dst, const ConvertOptions& options) {
  if (io::exists(dst)) {
    throw CheckpointError(
        fmt::format("'{}' already exists; remove it or choose another destination (nothing was written)", dst));
  }
  if (options.max_shard_bytes != 0) throw Error("max_shard_bytes applies to safetensors only");
  if (!options.mapping.empty()) throw Error("a name mapping applies to the export to safetensors only");
}

// Hands every stored tensor of `src`, whole and in its converted dtype, to
// `add`; a key that is also a common value is an error. Counts into `report`
// (all tensors are held at once).
void for_each_whole_tensor(const std::string& src, const StateDict& common, const ConvertOptions& options,
                           ConvertReport& report, const std::function<void(const std::string&, at::Tensor)>& add) {
  for (const auto& [key, value] : load_plain_tensors(src).as_dict()) {
    if (common.contains(key)) {
      throw CheckpointError(fmt::format("'{}' names both a tensor and a common value in '{}'", key, src));
    }
    at::Tensor t = value.as_tensor();
    const at::ScalarType dtype = stored_dtype(t.scalar_type(), options);
    if (dtype != t.scalar_type()) t = t.to(dtype);
    report.bytes += t.nbytes();
    ++report.tensors;
    add(key, std::move(t));
  }
  report.peak_buffer = report.bytes;
  report.files = 1;
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

}  // namespace

ConvertReport convert_to_safetensors(const std::string& src, const std::string& dst, const ConvertOptions& options) {
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
  const StateDict common = load_common_state_dict(src);
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, value] : common.as_dict()) dict.insert(key, to_ivalue(value, key));
  ConvertReport report;
  for_each_whole_tensor(src, common, options, report,
                        [&](const std::string& key, at::Tensor t) { dict.insert(key, std::move(t)); });
  const std::vector<char> bytes = torch::jit::pickle_save(dict);
  io::write_file_atomic(dst, std::string_view(bytes.data(), bytes.size()));
  if (options.progress) options.progress(report.bytes, report.bytes);
  return report;
}

ConvertReport convert_to_distckpt(const std::string& src, const std::string& dst, const ConvertOptions& options) {
  check_whole_target(dst, options);
  StateDict state = load_common_state_dict(src);
  ConvertReport report;
  // Stored keys are unique: only a common value can collide with one.
  for_each_whole_tensor(src, state, options, report, [&](const std::string& key, at::Tensor t) {
    state[key] = ShardedTensor::from_rank_offsets(key, std::move(t), {});
  });
  const std::shared_ptr<Communicator> one = make_single_process_communicator();
  save(state, dst, *one);
  if (options.progress) options.progress(report.bytes, report.bytes);
  return report;
}

}  // namespace distckpt
