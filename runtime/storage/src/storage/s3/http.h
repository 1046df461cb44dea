// One HTTP exchange over libcurl: a request with its headers and body, the
// response's status and the few headers S3 clients read, its body into a
// caller's buffer (checked against its size) or a bounded string. Easy
// handles are pooled, one per exchange in flight, so that connections are
// reused; the pool is shared by every thread of a client.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "storage/s3/config.h"
#include "storage/s3/sigv4.h"

namespace distckpt::s3 {

struct HttpRequest {
  std::string method;           // GET, HEAD, PUT, POST, DELETE
  std::string url;              // encoded
  std::vector<Header> headers;  // sent as they are, Host included
  const void* body = nullptr;   // PUT and POST; must stay valid during perform()
  size_t body_size = 0;
};

// Where a successful (2xx) response's body goes; any other status's body
// (an S3 error document) goes to HttpResponse::body, cut at kMaxErrorBody.
struct BodyTarget {
  void* buffer = nullptr;  // exactly into caller memory (ranged GET) ...
  size_t capacity = 0;
  size_t text_limit = 0;  // ... or into HttpResponse::body up to this many bytes; 0: discarded
};

inline constexpr size_t kMaxErrorBody = 64 << 10;

struct HttpResponse {
  long status = 0;
  std::optional<uint64_t> content_length;
  std::string etag;
  std::string content_range;
  std::string bucket_region;           // x-amz-bucket-region (region hints of 301/400/403)
  std::string request_id;              // x-amz-request-id
  std::string server_side_encryption;  // x-amz-server-side-encryption: which ETags are MD5s
  std::string sse_customer_algorithm;  // x-amz-server-side-encryption-customer-algorithm
  std::string body;                    // text body (bounded), see BodyTarget
  uint64_t body_bytes = 0;             // bytes received, whichever way they went
  bool body_overflow = false;          // a 2xx body was longer than its target: the transfer was stopped
};

// A failure below HTTP: no complete response (refused, reset, timed out, cut short).
struct TransportError {
  int curl_code = 0;
  std::string message;
  bool retryable = false;
};

class HttpClient {
 public:
  HttpClient(Timeouts timeouts, std::string ca_bundle, size_t max_idle_handles = 32);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs one exchange. A response of any status fills `response` and
  // returns nullopt; a transport failure is returned, not thrown.
  std::optional<TransportError> perform(const HttpRequest& request, const BodyTarget& target, HttpResponse& response);

 private:
  struct Handle;
  std::unique_ptr<Handle> acquire();
  void release(std::unique_ptr<Handle> handle);

  Timeouts timeouts_;
  std::string ca_bundle_;
  size_t max_idle_handles_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Handle>> idle_;  // each keeps its live connections
};

}  // namespace distckpt::s3
