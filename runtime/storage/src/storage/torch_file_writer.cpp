#include "storage/torch_file_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "format/dtype.h"
#include "format/torch_pickler.h"

namespace distckpt::storage {
namespace {

// torch.save's folder name: the file's name without its extension, where
// that is a plain name (zip names are UTF-8; a path may be any bytes).
std::string folder_for(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  name = name.substr(0, name.find('.'));
  const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  return plain ? name : "archive";
}

}  // namespace

TorchFileWriter::TorchFileWriter(const std::string& path, const StateDict& common, std::vector<Tensor> tensors)
    : paths_(io::staging_paths(path)), tensors_(std::move(tensors)), folder_(folder_for(paths_.target)) {
  if (io::lexists(paths_.target)) {  // a dangling link too: the commit would not replace it
    throw CheckpointError(
        fmt::format("'{}' already exists; remove it or choose another destination (nothing was written)",
                    paths_.target),
        paths_.target);
  }
  std::vector<torch_pickle::TensorEntry> entries;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    uint64_t elements = 1;
    for (int64_t s : t.sizes) elements *= static_cast<uint64_t>(s);
    sizes_.push_back(elements * dtype_size(t.dtype));
    bytes_ += sizes_.back();
    entries.push_back({t.name, t.dtype, t.sizes, std::to_string(i)});
  }
  const std::string pickle = torch_pickle::pickle_dict(common, entries);
  lock_ = std::make_unique<io::StagingLock>(paths_);
  io::remove_tree(paths_.staging);  // left by a crashed earlier run
  file_ = io::File(paths_.staging, io::File::Mode::kCreateTruncate);
  try {
    zip_ = std::make_unique<zip::Writer>(file_);
    zip_->begin(folder_ + "/data.pkl", pickle.size());
    zip_->write(pickle.data(), pickle.size());
    zip_->begin(folder_ + "/byteorder", 6);
    zip_->write("little", 6);
  } catch (...) {
    discard();  // a failed export leaves nothing behind
    throw;
  }
}

TorchFileWriter::~TorchFileWriter() {
  if (!committed_) discard();
}

void TorchFileWriter::discard() noexcept {
  try {
    file_.close();
    io::remove_tree(paths_.staging);
  } catch (const std::exception& e) {
    log_message(LogLevel::kWarning, fmt::format("could not remove '{}': {}", paths_.staging, e.what()));
  }
}

// Ends the open tensor (complete) and begins the records up to `index`
// (exclusive), each of which must hold no bytes.
void TorchFileWriter::begin_up_to(size_t index) {
  if (open_ && written_ != sizes_[current_]) {
    throw UsageError(
        fmt::format("tensor '{}' ended after {} of its {} bytes", tensors_[current_].name, written_, sizes_[current_]));
  }
  open_ = false;
  for (; next_ < index; ++next_) {
    if (sizes_[next_] != 0) throw UsageError(fmt::format("tensor '{}' was never written", tensors_[next_].name));
    zip_->begin(fmt::format("{}/data/{}", folder_, next_), 0);
  }
}

void TorchFileWriter::write(size_t index, uint64_t offset, const void* data, uint64_t n) {
  if (index >= tensors_.size()) throw UsageError(fmt::format("no tensor {} of {}", index, tensors_.size()));
  if (offset == 0 && index >= next_) {
    begin_up_to(index);
    zip_->begin(fmt::format("{}/data/{}", folder_, index), sizes_[index]);
    next_ = index + 1;
    current_ = index;
    written_ = 0;
    open_ = true;
  }
  if (!open_ || index != current_ || offset != written_ || n > sizes_[index] - written_) {
    throw UsageError(
        fmt::format("bytes [{}, {}) of tensor '{}' arrive out of order; a torch.save file is written in order", offset,
                    offset + n, tensors_[index].name));
  }
  zip_->write(data, n);
  written_ += n;
}

void TorchFileWriter::commit() {
  begin_up_to(tensors_.size());
  zip_->begin(folder_ + "/version", 2);
  zip_->write("3\n", 2);
  zip_->finish();
  file_.sync();
  file_.close();
  io::rename_no_replace(paths_.staging, paths_.target);
  io::fsync_dir(paths_.parent);
  committed_ = true;
}

}  // namespace distckpt::storage
