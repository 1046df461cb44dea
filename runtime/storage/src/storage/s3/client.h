// An S3 client for one bucket: objects read by range, written whole or in
// multipart uploads, listed and deleted, each request signed with SigV4 and
// retried with backoff within the configured budget (s3_errors.h says which
// failures are retried and what each raises). Thread-safe: any number of
// threads may call it at once; each request in flight holds one pooled
// connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/s3/config.h"
#include "storage/s3/sigv4.h"

namespace distckpt::s3 {

class HttpClient;
struct HttpResponse;
struct BodyTarget;
struct Failure;

struct ObjectInfo {
  uint64_t size = 0;
  std::string etag;  // as S3 sends it, quotes included
};

struct ListedObject {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
};

struct CompletedPart {
  int part_number = 0;  // 1 to 10000, ascending in a completion
  std::string etag;     // as upload_part returned it
};

class Client {
 public:
  // UsageError for a bucket name S3 would refuse.
  Client(Config config, std::string bucket);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Config& config() const { return config_; }
  const std::string& bucket() const { return bucket_; }

  // IoError with ENOENT when there is no such object.
  ObjectInfo head_object(const std::string& key);
  // Exactly `length` bytes from `offset` into `out`: a body shorter than
  // asked for is retried; a range past the object's end is IoError ERANGE.
  void get_range(const std::string& key, uint64_t offset, uint64_t length, void* out);
  // The whole object; IoError EFBIG when it is larger than `max_size`.
  std::string get_object(const std::string& key, size_t max_size);
  // Writes the object whole (Content-MD5 sent, the returned ETag checked).
  // With `if_none_match`, only when no object has that key: false when one
  // has (412 PreconditionFailed). A retry that meets 412 after an attempt
  // whose answer was lost reads the object back: when its ETag is the MD5
  // of `data`, the lost attempt wrote it, and the call returns true.
  bool put_object(const std::string& key, const void* data, size_t size, bool if_none_match = false);
  // Deleting a missing object succeeds (S3 answers 204 either way).
  void delete_object(const std::string& key);

  // Multipart uploads: parts of 5 MiB to 5 GiB (the last may be smaller),
  // numbered 1 to 10000. Returns the upload id.
  std::string create_multipart_upload(const std::string& key);
  // Returns the part's ETag; Content-MD5 is sent and the ETag checked against it.
  std::string upload_part(const std::string& key, const std::string& upload_id, int part_number, const void* data,
                          size_t size);
  // Returns the object's ETag. A retry that finds the upload gone after an
  // attempt whose answer was lost checks the object's ETag instead.
  std::string complete_multipart_upload(const std::string& key, const std::string& upload_id,
                                        const std::vector<CompletedPart>& parts);
  // An upload that is already gone counts as aborted.
  void abort_multipart_upload(const std::string& key, const std::string& upload_id);
  // The uploads in progress whose key starts with `prefix`, all pages.
  std::vector<MultipartUpload> list_multipart_uploads(const std::string& prefix);

  // The objects whose key starts with `prefix`, in key order, a page of at
  // most `page_size` keys per request (ListObjectsV2, continuation tokens);
  // memory stays one page whatever the number of objects.
  void list_objects(const std::string& prefix, const std::function<void(const ListedObject&)>& each,
                    int page_size = 1000);
  std::vector<ListedObject> list_objects(const std::string& prefix, int page_size = 1000);

  // Requests sent (attempts, each retry included) and retries, since construction.
  struct Stats {
    uint64_t attempts = 0;
    uint64_t retries = 0;
  };
  Stats stats() const { return Stats{attempts_.load(), retries_.load()}; }

 private:
  struct Call;
  struct Problem;
  using Check = std::function<std::optional<Problem>(const HttpResponse&)>;
  struct Outcome;

  Outcome execute(const Call& call, const BodyTarget& target, const Check& check);
  Failure failure_of(const Call& call, const HttpResponse& response) const;
  std::string object_of(const std::string& key) const;

  Config config_;
  std::string bucket_;
  bool virtual_hosted_;
  std::unique_ptr<HttpClient> http_;
  std::atomic<uint64_t> attempts_{0};
  std::atomic<uint64_t> retries_{0};
};

}  // namespace distckpt::s3
