// S3Backend: the Backend interface over s3::Client. Reads are ranged GETs
// (the client retries short bodies); an object is written in parts of
// part_size bytes as its bytes arrive, each part uploaded by the thread that
// completes it, so the memory a writer holds is the parts still being filled.
#include "storage/s3_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distckpt/core/errors.h"
#include "storage/s3/client.h"
#include "storage/s3/s3_url.h"

namespace distckpt::storage {
namespace {

constexpr uint64_t kMinPartBytes = uint64_t{5} << 20;  // S3's floor for all parts but the last
constexpr uint64_t kMaxPartBytes = uint64_t{5} << 30;
constexpr uint64_t kMaxParts = 10000;

// DISTCKPT_S3_PART_MB (default 16): larger parts mean fewer requests and
// more memory per object being written.
uint64_t part_size_from_env() {
  const char* text = std::getenv("DISTCKPT_S3_PART_MB");
  if (text == nullptr || *text == '\0') return uint64_t{16} << 20;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(text, &end, 10);
  const uint64_t bytes = static_cast<uint64_t>(mb) << 20;
  if (*end != '\0' || bytes < kMinPartBytes || bytes > kMaxPartBytes) {
    throw UsageError(fmt::format("DISTCKPT_S3_PART_MB='{}' is not a part size in MiB between 5 and 5120", text));
  }
  return bytes;
}

// DISTCKPT_S3_CONCURRENCY (default 8): requests in flight for one object,
// parts being uploaded or ranges being fetched. Memory per object written
// is at most this many parts in flight, plus the parts being filled.
int concurrency_from_env() {
  const char* text = std::getenv("DISTCKPT_S3_CONCURRENCY");
  if (text == nullptr || *text == '\0') return 8;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (*end != '\0' || n < 1 || n > 256) {
    throw UsageError(fmt::format("DISTCKPT_S3_CONCURRENCY='{}' is not a number of requests between 1 and 256", text));
  }
  return static_cast<int>(n);
}

// Runs tasks on their own threads, at most `limit` at once; wait() joins
// them and rethrows the first failure.
class BoundedTasks {
 public:
  explicit BoundedTasks(int limit) : limit_(limit) {}
  ~BoundedTasks() { drain(); }
  void run(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mutex_);
    room_.wait(lock, [&] { return running_ < limit_; });
    if (error_) std::rethrow_exception(error_);
    join_finished(lock);
    ++running_;
    try {
      threads_.emplace_back([this, task = std::move(task)] {
        std::exception_ptr error;
        try {
          task();
        } catch (...) {
          error = std::current_exception();
        }
        std::lock_guard<std::mutex> guard(mutex_);
        if (error && !error_) error_ = error;
        finished_.push_back(std::this_thread::get_id());
        --running_;
        room_.notify_all();
      });
    } catch (...) {
      --running_;  // no thread started
      throw;
    }
  }
  void wait() {
    drain();
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }
  void drain() noexcept {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads.swap(threads_);
      finished_.clear();
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  // Joins the threads whose task is over (at most `limit_` stay alive, so a
  // long object does not pile up a thread per part).
  void join_finished(std::unique_lock<std::mutex>& lock) {
    if (finished_.empty()) return;
    std::vector<std::thread> done;
    for (const std::thread::id id : finished_) {
      const auto it =
          std::find_if(threads_.begin(), threads_.end(), [&](const std::thread& t) { return t.get_id() == id; });
      if (it == threads_.end()) continue;
      done.push_back(std::move(*it));
      threads_.erase(it);
    }
    finished_.clear();
    lock.unlock();
    for (std::thread& t : done) t.join();  // each is past its last use of this object
    lock.lock();
  }

  const int limit_;
  std::mutex mutex_;
  std::condition_variable room_;
  int running_ = 0;
  std::vector<std::thread> threads_;
  std::vector<std::thread::id> finished_;  // of threads_, their task over
  std::exception_ptr error_;
};

// Ranges this long or longer are fetched as several GETs at once.
constexpr uint64_t kSplitReadBytes = uint64_t{8} << 20;

class S3Reader final : public ObjectReader {
 public:
  S3Reader(std::shared_ptr<s3::Client> client, std::string key, uint64_t size)
      : client_(std::move(client)), key_(std::move(key)), size_(size) {}
  uint64_t size() const override { return size_; }
  // Long enough to be split into concurrency_ GETs of kSplitReadBytes.
  uint64_t preferred_read_bytes() const override { return kSplitReadBytes * static_cast<uint64_t>(concurrency_); }
  void read(uint64_t offset, uint64_t length, uint8_t* out) const override {
    if (offset > size_ || size_ - offset < length) {
      throw CorruptionError(fmt::format("{}: {} bytes at {} pass its end ({} bytes)",
                                        s3::object_url(client_->bucket(), key_), length, offset, size_),
                            s3::object_url(client_->bucket(), key_));
    }
    if (length < 2 * kSplitReadBytes) {
      if (length > 0) client_->get_range(key_, offset, length, out);
      return;
    }
    // A long range: pieces fetched in parallel, as the AWS CLI does.
    BoundedTasks tasks(concurrency_);
    for (uint64_t at = 0; at < length; at += kSplitReadBytes) {
      const uint64_t n = std::min(kSplitReadBytes, length - at);
      tasks.run([this, offset, at, n, out] { client_->get_range(key_, offset + at, n, out + at); });
    }
    tasks.wait();
  }

 private:
  std::shared_ptr<s3::Client> client_;
  std::string key_;
  uint64_t size_;
  int concurrency_ = concurrency_from_env();
};

// Parts fill as bytes arrive at any offset; a full part is uploaded at once
// (the multipart upload starts with the first). An object smaller than one
// part is one PUT at finish.
class S3Writer final : public ObjectWriter {
 public:
  S3Writer(std::shared_ptr<s3::Client> client, std::string key, uint64_t part_size)
      : client_(std::move(client)), key_(std::move(key)), part_size_(part_size) {}
  ~S3Writer() override {
    if (!done_) abort();
  }

  uint64_t preferred_alignment() const override { return part_size_; }

  void write(uint64_t offset, const uint8_t* data, uint64_t length) override {
    while (length > 0) {
      const uint64_t index = offset / part_size_;
      const uint64_t within = offset - index * part_size_;
      const uint64_t n = std::min(length, part_size_ - within);
      if (index >= kMaxParts) {
        throw UsageError(fmt::format("{}: more than {} parts of {} bytes; raise DISTCKPT_S3_PART_MB", where(),
                                     kMaxParts, part_size_));
      }
      std::vector<uint8_t> full;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        Part& part = open_[index];
        if (part.bytes.empty()) part.bytes.assign(part_size_, 0);
        std::memcpy(part.bytes.data() + within, data, n);
        part.filled += n;
        if (part.filled == part_size_) {
          full = std::move(part.bytes);
          open_.erase(index);
        }
      }
      if (!full.empty()) {
        auto bytes = std::make_shared<std::vector<uint8_t>>(std::move(full));
        const int number = static_cast<int>(index + 1);
        dispatched_ = true;
        uploads_.run([this, number, bytes] { upload(number, bytes->data(), bytes->size()); });
      }
      offset += n;
      data += n;
      length -= n;
    }
  }

  void finish(uint64_t size) override {
    uploads_.wait();  // every full part uploaded (or the first failure raised)
    const uint64_t parts = (size + part_size_ - 1) / part_size_;
    if (!dispatched_ && parts <= 1) {
      // One PUT: nothing was uploaded yet, and the object fits a part.
      std::vector<uint8_t> bytes(size, 0);
      auto it = open_.find(0);
      if (it != open_.end()) std::memcpy(bytes.data(), it->second.bytes.data(), size);
      client_->put_object(key_, bytes.data(), bytes.size());
      open_.clear();
      done_ = true;
      return;
    }
    // What is still open is the last part (or parts padding never reached).
    for (auto& [index, part] : open_) {
      if (index >= parts) continue;
      const uint64_t bytes = std::min(part_size_, size - index * part_size_);
      uploads_.run(
          [this, index = index, data = part.bytes.data(), bytes] { upload(static_cast<int>(index + 1), data, bytes); });
    }
    uploads_.wait();
    open_.clear();
    std::vector<s3::CompletedPart> list;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      list = completed_;
    }
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.part_number < b.part_number; });
    if (list.size() != parts) {
      throw IoError(
          fmt::format("{}: {} of its {} parts were written; the object would have holes", where(), list.size(), parts),
          where(), EIO);
    }
    client_->complete_multipart_upload(key_, upload_id_, list);
    done_ = true;
  }

  void abort() noexcept override {
    done_ = true;
    uploads_.drain();  // no upload of ours still running
    std::string id;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      id = upload_id_;
      open_.clear();
    }
    if (id.empty()) return;
    try {
      client_->abort_multipart_upload(key_, id);  // no parts left behind
    } catch (...) {
      // The save's failure matters more; the coordinator's discard aborts leftovers too.
    }
  }

 private:
  struct Part {
    std::vector<uint8_t> bytes;
    uint64_t filled = 0;
  };

  std::string where() const { return s3::object_url(client_->bucket(), key_); }

  void upload(int number, const uint8_t* data, uint64_t size) {
    std::string id;
    {
      std::lock_guard<std::mutex> lock(start_mutex_);  // one creation, whoever completes a part first
      if (upload_id_.empty()) {
        const std::string created = client_->create_multipart_upload(key_);
        std::lock_guard<std::mutex> guard(mutex_);
        upload_id_ = created;
      }
      id = upload_id_;
    }
    const std::string etag = client_->upload_part(key_, id, number, data, size);
    std::lock_guard<std::mutex> lock(mutex_);
    completed_.push_back({number, etag});
  }

  std::shared_ptr<s3::Client> client_;
  std::string key_;
  uint64_t part_size_;
  std::mutex start_mutex_;
  std::mutex mutex_;
  std::string upload_id_;
  std::map<uint64_t, Part> open_;
  std::vector<s3::CompletedPart> completed_;
  bool done_ = false;
  std::atomic<bool> dispatched_{false};           // a full part went to upload: this is a multipart upload
  BoundedTasks uploads_{concurrency_from_env()};  // last: joined first
};

// Thrown by a listing callback to stop after enough objects.
struct ListedEnough {};

class S3Backend final : public Backend {
 public:
  S3Backend(std::shared_ptr<s3::Client> client, s3::S3Location where)
      : client_(std::move(client)), where_(std::move(where)), url_(where_.url()), part_size_(part_size_from_env()) {}

  const std::string& location() const override { return url_; }

  bool root_exists() override { return !list("", 1, true).empty(); }

  std::vector<StoredObject> list(const std::string& prefix, size_t limit, bool below) override {
    const std::string folder = where_.prefix.empty() ? "" : where_.prefix + "/";
    std::vector<StoredObject> out;
    try {
      client_->list_objects(folder + prefix, [&](const s3::ListedObject& o) {
        std::string name = o.key.substr(folder.size());
        if (!below && name.find('/', prefix.size()) != std::string::npos) return;
        out.push_back({std::move(name), o.size});
        if (limit != 0 && out.size() >= limit) throw ListedEnough{};
      });
    } catch (const ListedEnough&) {
      // enough
    }
    return out;
  }

  std::optional<uint64_t> size_of(const std::string& name) override {
    try {
      return client_->head_object(key_of(name)).size;
    } catch (const IoError& e) {
      if (e.error_number() == ENOENT) return std::nullopt;
      throw;
    }
  }

  std::vector<std::optional<uint64_t>> sizes_of(const std::vector<std::string>& names) override {
    if (names.size() <= 4) return Backend::sizes_of(names);
    // One listing instead of a request per object.
    std::map<std::string, uint64_t> listed;
    for (const StoredObject& o : list("", 0, true)) listed.emplace(o.name, o.size);
    std::vector<std::optional<uint64_t>> sizes;
    for (const std::string& name : names) {
      const auto it = listed.find(name);
      sizes.push_back(it == listed.end() ? std::nullopt : std::optional<uint64_t>(it->second));
    }
    return sizes;
  }

  std::unique_ptr<ObjectReader> open(const std::string& name) override {
    const std::string key = key_of(name);
    return std::make_unique<S3Reader>(client_, key, client_->head_object(key).size);
  }

  std::unique_ptr<ObjectWriter> create(const std::string& name, uint64_t /*size_hint*/) override {
    return std::make_unique<S3Writer>(client_, key_of(name), part_size_);
  }

  bool publish(const std::string& name, std::string_view bytes, bool if_absent) override {
    return client_->put_object(key_of(name), bytes.data(), bytes.size(), if_absent);
  }

  void remove(const std::string& name) override { client_->delete_object(key_of(name)); }

  void abort_unfinished(const std::string& name_prefix) override {
    for (const s3::MultipartUpload& u : client_->list_multipart_uploads(where_.key(name_prefix))) {
      client_->abort_multipart_upload(u.key, u.upload_id);
    }
  }

 private:
  std::string key_of(const std::string& name) const {
    check_object_name(name, url_);
    return where_.key(name);
  }

  std::shared_ptr<s3::Client> client_;
  s3::S3Location where_;
  std::string url_;
  uint64_t part_size_;
};

// One client per bucket and configuration for the process: its connection
// pool is reused by every backend of that bucket.
std::shared_ptr<s3::Client> client_for(const std::string& bucket) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<s3::Client>> clients;
  std::lock_guard<std::mutex> lock(mutex);
  const s3::Config config = s3::resolve_config();
  // Any setting that changes how requests go makes another client.
  const std::string id = fmt::format("{}|{}|{}|{}|{}|{}|{}", bucket, config.endpoint.url(), config.region,
                                     config.credentials.access_key_id, config.credentials.secret_access_key,
                                     config.credentials.session_token, config.retry.max_attempts);
  if (std::shared_ptr<s3::Client> client = clients[id].lock()) return client;
  auto client = std::make_shared<s3::Client>(config, bucket);
  clients[id] = client;
  return client;
}

}  // namespace

std::unique_ptr<Backend> make_s3_backend(const std::string& url) {
  s3::S3Location where = s3::parse_s3_url(url);
  return std::make_unique<S3Backend>(client_for(where.bucket), std::move(where));
}

Located locate_s3(const std::string& url) {
  s3::S3Location where = s3::parse_s3_url(url);
  std::shared_ptr<s3::Client> client = client_for(where.bucket);
  if (!where.prefix.empty()) {
    // An exact key: one file of its folder.
    try {
      client->head_object(where.prefix);
      const size_t slash = where.prefix.rfind('/');
      s3::S3Location folder{where.bucket, slash == std::string::npos ? "" : where.prefix.substr(0, slash)};
      const std::string name = slash == std::string::npos ? where.prefix : where.prefix.substr(slash + 1);
      return {std::make_shared<S3Backend>(client, std::move(folder)), name};
    } catch (const IoError& e) {
      if (e.error_number() != ENOENT) throw;
    }
  }
  return {std::make_shared<S3Backend>(client, std::move(where)), ""};
}

}  // namespace distckpt::storage
