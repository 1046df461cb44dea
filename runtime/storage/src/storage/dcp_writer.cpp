// A save into PyTorch's DCP format. Every rank writes its pieces into
// `__<rank>_0.distcp`, each piece an item: a torch.save archive of exactly
// that box (a ZeRO slice: of each box it decomposes into), its records
// aligned as torch.save aligns them. The values go straight from the
// piece's memory into the file (their CRC-32 computed first, so every byte
// is written once, in order: an object store takes them as a multipart
// upload). Ranks return their items' places; the coordinator writes the
// common state and `.metadata` last: the commit. In a directory everything
// is staged beside the target and renamed into place; on an object store the
// objects are written under the prefix and `.metadata` is published only if
// absent.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "distckpt/core/errors.h"
#include "distckpt/core/sharded_object.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/dcp.h"
#include "format/dcp_metadata.h"
#include "format/torch_pickler.h"
#include "format/zip_writer.h"
#include "io/file.h"
#include "io/staging.h"
#include "storage/dcp_storage.h"
#include "storage/directory_commit.h"
#include "storage/posix_backend.h"

namespace distckpt {
namespace {

constexpr uint64_t kItemAlignment = 64;  // each item's archive starts aligned, as its records are
constexpr const char* kMegatronMarker = "metadata.json";
constexpr const char* kMegatronCommon = "common.pt";

// One record of a torch.save archive, its bytes where they already are.
struct Record {
  std::string name;
  const void* data;
  uint64_t size;
};

// torch.save's archive of `records` (folder "archive/", as torch.save names
// it when writing to a buffer) through `sink`, from offset 0; its size.
uint64_t write_archive(const std::vector<Record>& records, const zip::Writer::Sink& sink) {
  zip::Writer zip(sink);
  for (const Record& r : records) {
    zip::Crc32 crc;
    crc.update(r.data, r.size);
    zip.begin("archive/" + r.name, r.size, crc.value());
    zip.write(r.data, r.size);
  }
  return zip.finish();
}

constexpr char kByteOrder[] = "little";
constexpr char kVersion[] = "3\n";

// torch.save(tensor) of `numel` elements at `data`, shaped `sizes`.
uint64_t write_tensor_archive(at::ScalarType dtype, const Shape& sizes, const void* data, uint64_t bytes,
                              const zip::Writer::Sink& sink) {
  const std::string pickle = torch_pickle::pickle_tensor(dtype, sizes, "0");
  return write_archive({{"data.pkl", pickle.data(), pickle.size()},
                        {"byteorder", kByteOrder, sizeof kByteOrder - 1},
                        {"data/0", data, bytes},
                        {"version", kVersion, sizeof kVersion - 1}},
                       sink);
}

// torch.save(value): plain values and the tensors inside them.
uint64_t write_value_archive(const Value& value, const std::string& where, const zip::Writer::Sink& sink) {
  std::vector<at::Tensor> tensors;
  const std::string pickle = torch_pickle::pickle_value(value, where, tensors);
  std::vector<Record> records{{"data.pkl", pickle.data(), pickle.size()},
                              {"byteorder", kByteOrder, sizeof kByteOrder - 1}};
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    names.push_back(fmt::format("data/{}", i));
    records.push_back({names.back(), tensors[i].data_ptr(), tensors[i].nbytes()});
  }
  records.push_back({"version", kVersion, sizeof kVersion - 1});
  return write_archive(records, sink);
}

// What a rank wrote, for the coordinator: one entry per item.
struct WrittenItem {
  bool tensor = true;
  std::string key;
  Shape offsets, sizes;  // a tensor item's box
  std::string file;
  uint64_t offset = 0, length = 0;
};

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_string(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}

class ResultReader {
 public:
  explicit ResultReader(const std::string& in) : in_(in) {}
  bool done() const { return at_ == in_.size(); }
  uint64_t u64() {
    need(sizeof(uint64_t));
    uint64_t v;
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string string() {
    const uint64_t n = u64();
    need(n);
    std::string s = in_.substr(at_, n);
    at_ += n;
    return s;
  }

 private:
  void need(uint64_t n) const {
    if (n > in_.size() - at_) throw CommError("a rank's report of its DCP items is truncated");
  }
  const std::string& in_;
  size_t at_ = 0;
};

std::string encode_items(const std::vector<WrittenItem>& items) {
  std::string out;
  for (const WrittenItem& i : items) {
    put_u64(out, i.tensor ? 1 : 0);
    put_string(out, i.key);
    put_u64(out, i.offsets.size());
    for (size_t d = 0; d < i.offsets.size(); ++d) {
      put_u64(out, static_cast<uint64_t>(i.offsets[d]));
      put_u64(out, static_cast<uint64_t>(i.sizes[d]));
    }
    put_string(out, i.file);
    put_u64(out, i.offset);
    put_u64(out, i.length);
  }
  return out;
}

std::vector<WrittenItem> decode_items(const std::string& in) {
  std::vector<WrittenItem> out;
  ResultReader r(in);
  while (!r.done()) {
    WrittenItem i;
    i.tensor = r.u64() != 0;
    i.key = r.string();
    const uint64_t ndim = r.u64();
    if (ndim > 64) throw CommError("a rank reported a DCP item of more than 64 dimensions");
    for (uint64_t d = 0; d < ndim; ++d) {
      i.offsets.push_back(static_cast<int64_t>(r.u64()));
      i.sizes.push_back(static_cast<int64_t>(r.u64()));
    }
    i.file = r.string();
    i.offset = r.u64();
    i.length = r.u64();
    out.push_back(std::move(i));
  }
  return out;
}

// One object written front to back, items aligned, through its ObjectWriter.
class ItemFile {
 public:
  ItemFile(Backend& backend, const std::string& name) : writer_(backend.create(name, 0)) {}
  ~ItemFile() {
    if (writer_) writer_->abort();
  }
  // The next item, written by `write(sink)`: its offset and length.
  std::pair<uint64_t, uint64_t> add(const std::function<uint64_t(const zip::Writer::Sink&)>& write) {
    static const char kZeros[kItemAlignment] = {};
    const uint64_t padding = (kItemAlignment - at_ % kItemAlignment) % kItemAlignment;
    writer_->write(at_, reinterpret_cast<const uint8_t*>(kZeros), padding);
    at_ += padding;
    const uint64_t base = at_;
    const uint64_t length = write([&](uint64_t offset, const void* data, uint64_t n) {
      writer_->write(base + offset, static_cast<const uint8_t*>(data), n);
    });
    at_ = base + length;
    return {base, length};
  }
  void finish() {
    writer_->finish(at_);
    writer_.reset();
  }

 private:
  std::unique_ptr<ObjectWriter> writer_;
  uint64_t at_ = 0;
};

class DcpStorageWriter final : public StorageWriter {
 public:
  DcpStorageWriter(const std::string& location, DcpWriteOptions options) : options_(std::move(options)) {
    if (is_object_store(location)) {
      store_ = open_backend(location);
      paths_.target = location;
    } else {
      paths_ = io::staging_paths(location);
    }
  }

  StorageFormat format() const override { return dcp_format(options_); }
  const std::string& location() const override { return paths_.target; }

  void claim() override {
    claim_ = std::make_unique<storage::InFlightClaim>(paths_, /*lock_directory=*/!store_);
    if (store_ ? store_->root_exists() : !io::holds_nothing(paths_.target)) {
      throw CheckpointError(fmt::format("'{}' already exists; a DCP save never replaces files: remove it or save into "
                                        "another location (nothing was written)",
                                        paths_.target),
                            paths_.target);
    }
    if (!store_) {
      io::make_dirs(paths_.parent);
      io::remove_tree(paths_.staging);  // left by a crashed earlier save
      io::make_dirs(paths_.staging);
    }
  }

  void prepare(const SaveContents& contents) override {
    for (const SaveTensor& t : contents.tensors) tensors_.emplace(t.key, t);
    common_ = contents.common ? *contents.common : Value::dict();
    prepared_ = true;
  }

  // A writer called more than once (a conversion, tensor after tensor)
  // writes one more file each time: __<rank>_0.distcp, __<rank>_1.distcp, ...
  std::string write(int rank, std::vector<SavePiece> pieces) override {
    const bool common_here = prepared_ && !common_written_ && !options_.torch_dist && !common_.as_dict().empty();
    if (pieces.empty() && !common_here) return {};
    std::shared_ptr<Backend> backend = writing_backend();
    const std::string name = fmt::format("__{}_{}.distcp", rank, files_written_++);
    ItemFile file(*backend, name);
    std::vector<WrittenItem> items;
    for (const SavePiece& piece : pieces) {
      if (piece.object) {
        const std::string key = ShardedObject{piece.key, "", piece.global_shape, piece.box.offset}.unique_key();
        const auto [at, length] = file.add([&](const zip::Writer::Sink& sink) {
          sink(0, piece.object->data(), piece.object->size());
          return static_cast<uint64_t>(piece.object->size());
        });
        items.push_back({false, key, {}, {}, name, at, length});
        continue;
      }
      const at::Tensor host = piece.data.device().is_cpu() ? piece.data : piece.data.cpu();
      const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
      const uint64_t element = host.element_size();
      std::vector<FlatPiece> boxes;  // a ZeRO slice is the boxes it decomposes into, each contiguous in it
      if (piece.flat) {
        boxes = decompose_flat_range(piece.box, *piece.flat);
        for (FlatPiece& b : boxes) b.flat_start -= piece.flat->start;
      } else {
        boxes.push_back({piece.box, 0});
      }
      for (const FlatPiece& b : boxes) {
        if (b.box.empty()) continue;
        const uint64_t n = static_cast<uint64_t>(b.box.numel()) * element;
        const uint8_t* data = bytes + static_cast<uint64_t>(b.flat_start) * element;
        const auto [at, length] = file.add([&](const zip::Writer::Sink& sink) {
          return write_tensor_archive(host.scalar_type(), b.box.length, data, n, sink);
        });
        items.push_back({true, piece.key, b.box.offset, b.box.length, name, at, length});
      }
    }
    if (common_here) {
      for (const auto& [key, value] : common_.as_dict()) {
        const auto [at, length] = file.add(
            [&, &v = value, &k = key](const zip::Writer::Sink& sink) { return write_value_archive(v, k, sink); });
        items.push_back({false, key, {}, {}, name, at, length});
      }
      common_written_ = true;
    }
    file.finish();
    return encode_items(items);
  }

  void commit(const std::vector<std::string>& written) override {
    if (!prepared_) throw UsageError("a DCP save was committed before it was prepared");
    dcp::Metadata metadata;
    std::map<std::string, dcp::Tensor> tensors;
    for (const auto& [key, t] : tensors_) tensors[key] = dcp::Tensor{key, t.dtype, std::nullopt, t.global_shape, {}};
    for (size_t r = 0; r < written.size(); ++r) {
      for (WrittenItem& item : decode_items(written[r])) {
        dcp::StorageInfo storage{std::move(item.file), item.offset, item.length, {}};
        if (!item.tensor) {
          metadata.bytes.push_back(dcp::BytesItem{item.key, std::move(storage)});
          continue;
        }
        const auto t = tensors.find(item.key);
        if (t == tensors.end())
          throw UsageError(fmt::format("rank {} wrote '{}', which the save does not hold", r, item.key));
        t->second.chunks.push_back(dcp::Chunk{item.offsets, item.sizes, std::move(storage)});
      }
    }
    for (auto& [key, t] : tensors) metadata.tensors.push_back(std::move(t));
    std::sort(metadata.bytes.begin(), metadata.bytes.end(),
              [](const dcp::BytesItem& a, const dcp::BytesItem& b) { return a.key < b.key; });
    // DCP keys every item by one flat name.
    std::set<std::string> keys;
    for (const dcp::Tensor& t : metadata.tensors) keys.insert(t.key);
    for (const dcp::BytesItem& b : metadata.bytes) {
      if (!keys.insert(b.key).second) {
        throw UsageError(
            fmt::format("'{}' names both a tensor (or object) and a common value, which a DCP checkpoint "
                        "keys by one name: rename one of them",
                        b.key));
      }
    }
    std::shared_ptr<Backend> backend = writing_backend();
    if (options_.torch_dist) write_megatron_files(*backend);
    const std::string bytes = dcp::encode_metadata(metadata, options_.naming == DcpWriteOptions::Naming::kTorch113
                                                                 ? dcp::ModuleNaming::kTorch113
                                                                 : dcp::ModuleNaming::kTorch2);
    if (!backend->publish(storage::kDcpMetadataFile, bytes, /*if_absent=*/true)) {
      throw CheckpointError(fmt::format("another save committed '{}' while this one was writing; give each save its "
                                        "own location",
                                        paths_.target),
                            paths_.target);
    }
    if (!store_) {
      io::fsync_dir(paths_.staging);
      io::rename_into_empty(paths_.staging, paths_.target);
      io::fsync_dir(paths_.parent);
    }
    claim_.reset();
  }

  void discard() noexcept override {
    if (!claim_) return;  // another save's staging is not ours to remove
    try {
      if (store_) {
        store_->abort_unfinished("");
        for (const StoredObject& o : store_->list("")) store_->remove(o.name);
      } else {
        io::remove_tree(paths_.staging);
      }
    } catch (...) {  // the original error matters more
    }
    claim_.reset();
  }

 private:
  // Where the ranks write: the object store's prefix, or the staging directory.
  std::shared_ptr<Backend> writing_backend() const {
    if (store_) return store_;
    return std::make_shared<storage::PosixBackend>(paths_.staging);
  }

  // Megatron's marker and common state (torch.save of the common dict).
  void write_megatron_files(Backend& backend) const {
    ItemFile common(backend, kMegatronCommon);
    common.add([&](const zip::Writer::Sink& sink) { return write_value_archive(common_, "common", sink); });
    common.finish();
    const std::string marker =
        R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", )"
        R"("common_backend_version": 1})";
    backend.publish(kMegatronMarker, marker, /*if_absent=*/true);
  }

  DcpWriteOptions options_;
  io::StagingPaths paths_;
  std::shared_ptr<Backend> store_;  // an object store's, else none
  std::unique_ptr<storage::InFlightClaim> claim_;
  // Coordinator, from prepare: what the save holds.
  bool prepared_ = false;
  bool common_written_ = false;
  int files_written_ = 0;  // by this writer's rank
  std::map<std::string, SaveTensor> tensors_;
  Value common_ = Value::dict();
};

}  // namespace

StorageFormat dcp_format(DcpWriteOptions options) {
  return StorageFormat("dcp", std::make_shared<const DcpWriteOptions>(std::move(options)));
}

std::unique_ptr<StorageWriter> make_dcp_writer(const std::string& location, DcpWriteOptions options) {
  return std::make_unique<DcpStorageWriter>(location, std::move(options));
}

}  // namespace distckpt
