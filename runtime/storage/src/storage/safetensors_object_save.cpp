#include "storage/safetensors_object_save.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "distckpt/core/errors.h"

namespace distckpt::storage {
namespace {

constexpr const char* kStaging = ".distckpt-staging/";
constexpr const char* kLayout = ".distckpt-staging/layout/";
constexpr const char* kRuns = ".distckpt-staging/runs/";
constexpr uint64_t kWindowBytes = uint64_t{16} << 20;
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // as the reader's limit

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(std::string_view bytes, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[at + static_cast<size_t>(i)]);
  return v;
}

struct Run {
  uint64_t file = 0;
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  size_t source = 0;           // the rank's object
  uint64_t source_offset = 0;  // in it
};

// One rank's result: its object's name, then its runs.
void decode_result(const std::string& result, size_t source, std::vector<std::string>& sources,
                   std::vector<Run>& runs) {
  if (result.empty()) return;  // the rank wrote nothing
  if (result.size() < 8) throw ProtocolError("a safetensors save's write result is truncated");
  const uint64_t name_length = get_u64(result, 0);
  if (name_length > result.size() - 8 || (result.size() - 8 - name_length) % 24 != 0) {
    throw ProtocolError("a safetensors save's write result is malformed");
  }
  sources.push_back(result.substr(8, name_length));
  uint64_t at = 0;
  for (size_t i = 8 + name_length; i < result.size(); i += 24) {
    const Run r{get_u64(result, i), get_u64(result, i + 8), get_u64(result, i + 16), source, at};
    at += r.length;
    runs.push_back(r);
  }
}

}  // namespace

void publish_safetensors_layout(Backend& backend, const SafetensorsWriter& writer) {
  const std::vector<SafetensorsWriter::File>& files = writer.layout();
  for (size_t f = 0; f < files.size(); ++f) {
    std::string bytes;
    put_u64(bytes, files[f].size);
    bytes += files[f].header;
    backend.publish(fmt::format("{}{:05d}", kLayout, f), bytes, /*if_absent=*/false);
  }
}

SafetensorsLayout read_safetensors_layout(Backend& backend) {
  SafetensorsLayout layout;
  for (const StoredObject& o : backend.list(kLayout)) {
    const std::string text = o.name.substr(std::char_traits<char>::length(kLayout));
    const size_t file = static_cast<size_t>(std::stoull(text));
    const std::string bytes = backend.read_small(o.name, kMaxHeaderBytes);
    const std::string origin = backend.describe(o.name);
    if (bytes.size() < 8 + safetensors::kPrefixBytes) throw CorruptionError(origin + " is truncated", origin);
    const uint64_t size = get_u64(bytes, 0);
    const uint64_t n = safetensors::header_length(reinterpret_cast<const uint8_t*>(bytes.data()) + 8, size, origin);
    if (n > bytes.size() - 8 - safetensors::kPrefixBytes) throw CorruptionError(origin + " is truncated", origin);
    const safetensors::Header header =
        safetensors::parse_header(std::string_view(bytes).substr(8 + safetensors::kPrefixBytes, n), size, origin);
    for (const safetensors::Entry& e : header.tensors) layout.tensors[e.name] = {file, e.begin};
  }
  return layout;
}

SafetensorsRuns::SafetensorsRuns(Backend& backend) : backend_(backend) {
  std::random_device random;
  name_ = fmt::format("{}{:08x}{:08x}.bin", kRuns, random(), random());
  object_ = backend_.create(name_, 0);
  put_u64(runs_, name_.size());
  runs_ += name_;
}

SafetensorsRuns::~SafetensorsRuns() {
  if (object_) object_->abort();
}

void SafetensorsRuns::add(size_t file, uint64_t offset, const uint8_t* data, uint64_t n) {
  if (n == 0) return;
  object_->write(written_, data, n);
  written_ += n;
  put_u64(runs_, file);
  put_u64(runs_, offset);
  put_u64(runs_, n);
}

std::string SafetensorsRuns::finish() {
  object_->finish(written_);
  object_.reset();
  return runs_;
}

void assemble_safetensors(Backend& backend, SafetensorsWriter& writer, const std::vector<std::string>& results) {
  std::vector<std::string> sources;
  std::vector<Run> runs;
  for (const std::string& result : results) decode_result(result, sources.size(), sources, runs);
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
  std::vector<std::unique_ptr<ObjectReader>> readers;
  for (const std::string& name : sources) readers.push_back(backend.open(name));

  // Window by window of each file, in order: each object's parts fill and
  // go as the windows pass. Within a window, a rank's runs are mostly
  // consecutive in its object (it wrote them in row order): one GET each.
  std::vector<uint8_t> window(kWindowBytes), fetched;
  size_t next = 0;
  for (size_t f = 0; f < writer.layout().size(); ++f) {
    const uint64_t begin = writer.layout()[f].header.size(), end = writer.layout()[f].size;
    for (uint64_t w = begin; w < end; w += kWindowBytes) {
      const uint64_t w_end = std::min(end, w + kWindowBytes);
      std::fill(window.begin(), window.begin() + static_cast<ptrdiff_t>(w_end - w), 0);
      // The runs meeting this window, by source, in source order.
      std::map<size_t, std::vector<Run>> pieces;
      for (size_t i = next; i < runs.size() && runs[i].file == f && runs[i].offset < w_end; ++i) {
        const uint64_t lo = std::max(runs[i].offset, w), hi = std::min(runs[i].offset + runs[i].length, w_end);
        if (lo < hi) {
          pieces[runs[i].source].push_back(
              {f, lo, hi - lo, runs[i].source, runs[i].source_offset + (lo - runs[i].offset)});
        }
      }
      for (auto& [source, list] : pieces) {
        std::sort(list.begin(), list.end(),
                  [](const Run& a, const Run& b) { return a.source_offset < b.source_offset; });
        for (size_t a = 0; a < list.size();) {
          size_t b = a + 1;  // [a, b): consecutive in the source
          while (b < list.size() && list[b].source_offset == list[b - 1].source_offset + list[b - 1].length) ++b;
          const uint64_t from = list[a].source_offset;
          const uint64_t bytes = list[b - 1].source_offset + list[b - 1].length - from;
          fetched.resize(bytes);
          readers[source]->read(from, bytes, fetched.data());
          for (size_t i = a; i < b; ++i) {
            std::memcpy(window.data() + (list[i].offset - w), fetched.data() + (list[i].source_offset - from),
                        list[i].length);
          }
          a = b;
        }
      }
      writer.write_file(f, w, window.data(), w_end - w);
      while (next < runs.size() && runs[next].file == f && runs[next].offset + runs[next].length <= w_end) ++next;
    }
    while (next < runs.size() && runs[next].file == f) ++next;
    writer.finish_file(f);  // its last part goes now, not at the end
  }
  writer.commit();
}

void remove_safetensors_staging(Backend& backend) noexcept {
  try {
    backend.abort_unfinished(kStaging);
    for (const StoredObject& o : backend.list(kStaging)) backend.remove(o.name);
  } catch (...) {  // the save's outcome matters more; a later save refuses the prefix and says why
  }
}

}  // namespace distckpt::storage
