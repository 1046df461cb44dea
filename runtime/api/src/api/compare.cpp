// diff_checkpoints and extract_tensor: whole-checkpoint inspection helpers.
#include "distckpt/api/compare.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "distckpt/api/checkpoint.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "io/file.h"
#include "load/checkpoint_reader.h"
#include "storage/torch_file_reader.h"

namespace distckpt {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Where two tensors of one dtype and shape differ.
std::string value_difference(const at::Tensor& a, const at::Tensor& b) {
  // NaN equals NaN here: a checkpoint holding the same NaNs holds the same state.
  const at::Tensor differs = a.ne(b).logical_and(a.isnan().logical_and(b.isnan()).logical_not());
  const int64_t count = differs.sum().item<int64_t>();
  if (count == 0) return "the same values in other bit patterns (-0.0 and 0.0, or NaN payloads)";
  const at::Tensor first = differs.nonzero()[0];
  std::vector<int64_t> index(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + first.numel());
  std::vector<at::indexing::TensorIndex> at_first(index.begin(), index.end());
  std::string detail =
      fmt::format("{} of {} elements differ, first at [{}] ({} vs {})", count, a.numel(), fmt::join(index, ", "),
                  a.index(at_first).item().toDouble(), b.index(at_first).item().toDouble());
  if (a.is_floating_point() || a.is_complex()) {
    // Over the differing elements; NaN on one side only makes that gap NaN.
    const at::Tensor gap = (a - b).abs().masked_select(differs);
    detail += gap.isnan().any().item<bool>() ? std::string(", max |difference| nan (NaN on one side)")
                                             : fmt::format(", max |difference| {}", gap.max().item().toDouble());
  }
  return detail;
}

// The two checkpoints' tensors, whole: their readers are opened on the first
// tensor that differs and serve every later one.
class TensorPairs {
 public:
  TensorPairs(const std::string& left, const std::string& right) : dirs_{left, right} {}

  std::pair<at::Tensor, at::Tensor> read(const std::string& key) {
    for (int side = 0; side < 2; ++side) {
      if (!readers_[side]) readers_[side].emplace(dirs_[side]);
    }
    return {readers_[0]->read_whole(readers_[0]->tensor_record(key)),
            readers_[1]->read_whole(readers_[1]->tensor_record(key))};
  }

 private:
  std::string dirs_[2];
  std::optional<loading::CheckpointReader> readers_[2];
};

// Where two stored tensors with equal dtype names and shapes but different
// digests differ: by value when this build can load them, else just that.
std::string values_detail(TensorPairs& tensors, const std::string& key, const std::string& dtype) {
  const std::string reason = unrepresentable_reason(dtype);
  if (!reason.empty()) return fmt::format("the stored bytes differ ({})", reason);
  try {
    const auto [a, b] = tensors.read(key);
    return value_difference(a, b);
  } catch (const c10::Error&) {
    // Comparisons LibTorch lacks for the type on the CPU (float8, uint16/32/64 in some versions).
    return fmt::format("the stored bytes differ (LibTorch cannot compare {} values)", dtype);
  }
}

void write_safetensors(const std::string& file, const std::string& key, const at::Tensor& tensor) {
  std::vector<safetensors::Entry> entries{
      {key, tensor.scalar_type(), Shape(tensor.sizes().begin(), tensor.sizes().end())}};
  std::string bytes = safetensors::encode_header(entries, {{safetensors::kFormatKey, "pt"}});
  const at::Tensor contiguous = tensor.contiguous();
  bytes.append(static_cast<const char*>(contiguous.data_ptr()), contiguous.nbytes());
  io::write_file_atomic(file, bytes);
}

// Objects grouped by key: each key's shard grid and its shards by unique key.
struct ObjectShards {
  Shape grid;
  std::map<std::string, const std::string*> shards;
};

std::map<std::string, ObjectShards> objects_by_key(const StateDict& objects) {
  std::map<std::string, ObjectShards> out;
  for (const auto& [unique_key, value] : objects.as_dict()) {
    const ShardedObject& o = value.as_sharded_object();
    ObjectShards& entry = out[o.key];
    entry.grid = o.global_shape;
    entry.shards.emplace(unique_key, &o.data);
  }
  return out;
}

void diff_objects(const StateDict& left_objects, const StateDict& right_objects, CheckpointDiff& out) {
  const std::map<std::string, ObjectShards> a = objects_by_key(left_objects);
  const std::map<std::string, ObjectShards> b = objects_by_key(right_objects);
  for (const auto& [key, l] : a) {
    const auto it = b.find(key);
    if (it == b.end()) {
      for (const auto& shard : l.shards) out.objects_only_left.push_back(shard.first);
      continue;
    }
    const ObjectShards& r = it->second;
    if (l.grid != r.grid) {
      out.objects_other_grid.push_back(fmt::format("{}: grid {} vs {}", key, to_string(l.grid), to_string(r.grid)));
      continue;
    }
    for (const auto& [unique_key, bytes] : l.shards) {
      const auto other = r.shards.find(unique_key);
      if (other == r.shards.end()) {
        out.objects_only_left.push_back(unique_key);
      } else if (*bytes != *other->second) {
        out.objects_differ.push_back(unique_key);
      }
    }
    for (const auto& shard : r.shards) {
      if (!l.shards.count(shard.first)) out.objects_only_right.push_back(shard.first);
    }
  }
  for (const auto& [key, r] : b) {
    if (a.count(key)) continue;
    for (const auto& shard : r.shards) out.objects_only_right.push_back(shard.first);
  }
}

}  // namespace

const char* difference_status_name(TensorDifference::Status status) {
  switch (status) {
    case TensorDifference::Status::kEqual:
      return "equal";
    case TensorDifference::Status::kOnlyLeft:
      return "only_left";
    case TensorDifference::Status::kOnlyRight:
      return "only_right";
    case TensorDifference::Status::kDtype:
      return "dtype";
    case TensorDifference::Status::kShape:
      return "shape";
    case TensorDifference::Status::kValues:
      return "values";
  }
  return "unknown";
}

bool CheckpointDiff::tensors_equal() const {
  return std::all_of(tensors.begin(), tensors.end(),
                     [](const TensorDifference& t) { return t.status == TensorDifference::Status::kEqual; });
}

bool CheckpointDiff::objects_equal() const {
  return objects_only_left.empty() && objects_only_right.empty() && objects_differ.empty() &&
         objects_other_grid.empty();
}

bool CheckpointDiff::equal(bool including_objects) const {
  return tensors_equal() && common_only_left.empty() && common_only_right.empty() && common_differ.empty() &&
         !content_metadata_differs && (!including_objects || objects_equal());
}

CheckpointDiff diff_checkpoints(const std::string& left, const std::string& right) {
  std::map<std::string, TensorDigest> a;
  std::map<std::string, TensorDigest> b;
  for (TensorDigest& d : digest_checkpoint(left)) a.emplace(d.key, std::move(d));
  for (TensorDigest& d : digest_checkpoint(right)) b.emplace(d.key, std::move(d));
  CheckpointDiff out;
  TensorPairs tensors(left, right);
  using Status = TensorDifference::Status;
  for (const auto& [key, l] : a) {
    const auto it = b.find(key);
    if (it == b.end()) {
      out.tensors.push_back({key, Status::kOnlyLeft, ""});
    } else if (l.dtype != it->second.dtype) {
      out.tensors.push_back({key, Status::kDtype, l.dtype + " vs " + it->second.dtype});
    } else if (l.shape != it->second.shape) {
      out.tensors.push_back({key, Status::kShape, to_string(l.shape) + " vs " + to_string(it->second.shape)});
    } else if (l.hash == it->second.hash) {
      out.tensors.push_back({key, Status::kEqual, ""});
    } else {
      const std::string detail = values_detail(tensors, key, l.dtype);
      out.tensors.push_back({key, Status::kValues, detail});
    }
  }
  for (const auto& [key, r] : b) {
    if (!a.count(key)) out.tensors.push_back({key, Status::kOnlyRight, ""});
  }
  std::sort(out.tensors.begin(), out.tensors.end(), [](const auto& x, const auto& y) { return x.key < y.key; });
  const DiffResult common = diff(load_common_state_dict(left), load_common_state_dict(right));
  for (const Path& p : common.only_left) out.common_only_left.push_back(to_string(p));
  for (const Path& p : common.only_right) out.common_only_right.push_back(to_string(p));
  for (const Path& p : common.mismatch_paths()) out.common_differ.push_back(to_string(p));
  diff_objects(load_all_sharded_objects(left), load_all_sharded_objects(right), out);
  const std::optional<StateDict> a_content = load_content_metadata(left);
  const std::optional<StateDict> b_content = load_content_metadata(right);
  out.content_metadata_differs =
      a_content.has_value() != b_content.has_value() || (a_content && !a_content->equals(*b_content));
  return out;
}

void extract_tensor(const std::string& dir, const std::string& key, const std::string& file) {
  const bool to_safetensors = ends_with(file, ".safetensors");
  if (!to_safetensors && !ends_with(file, ".pt")) {
    throw UsageError(fmt::format("extract: '{}' must end in .safetensors or .pt (the format to write)", file));
  }
  if (io::exists(file)) throw UsageError(fmt::format("extract: '{}' exists; name a new file", file));
  const at::Tensor tensor = load_plain_tensor(dir, key);
  if (to_safetensors) {
    write_safetensors(file, key, tensor);
  } else {
    storage::write_torch_file(file, Value::dict(), {{key, tensor}});
  }
}

}  // namespace distckpt
