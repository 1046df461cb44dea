#include "storage/s3/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include "distckpt/core/errors.h"

namespace distckpt::s3 {
namespace {

constexpr size_t kMaxHeaderValue = 1024;  // none of the headers read here is longer

std::once_flag curl_initialized;

bool retryable_curl_code(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:  // a resolver hiccup; a wrong name fails every attempt the same way
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_AGAIN:
    case CURLE_SEND_FAIL_REWIND:
      return true;
    default:
      return false;
  }
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

// The state of one exchange, reached from curl's callbacks.
struct Transfer {
  const HttpRequest* request;
  const BodyTarget* target;
  HttpResponse* response;
  size_t sent = 0;  // bytes of the request body handed to curl
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  const std::string_view line = trim(std::string_view(data, bytes));
  HttpResponse& r = *t.response;
  if (line.substr(0, 5) == "HTTP/") {  // a new response (after a 100 Continue): forget the last one's headers
    r = HttpResponse{};
    const size_t space = line.find(' ');
    if (space != std::string_view::npos) {
      r.status = std::strtol(std::string(line.substr(space + 1, 3)).c_str(), nullptr, 10);
    }
    return bytes;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return bytes;
  const std::string_view name = trim(line.substr(0, colon));
  std::string_view value = trim(line.substr(colon + 1));
  value = value.substr(0, kMaxHeaderValue);
  if (iequals(name, "content-length")) {
    const std::string digits(value);
    char* end = nullptr;
    const unsigned long long n = std::strtoull(digits.c_str(), &end, 10);
    if (!digits.empty() && *end == '\0' && std::isdigit(static_cast<unsigned char>(digits[0]))) r.content_length = n;
  } else if (iequals(name, "etag")) {
    r.etag = value;
  } else if (iequals(name, "content-range")) {
    r.content_range = value;
  } else if (iequals(name, "x-amz-bucket-region")) {
    r.bucket_region = value;
  } else if (iequals(name, "x-amz-request-id")) {
    r.request_id = value;
  } else if (iequals(name, "x-amz-server-side-encryption")) {
    r.server_side_encryption = value;
  } else if (iequals(name, "x-amz-server-side-encryption-customer-algorithm")) {
    r.sse_customer_algorithm = value;
  }
  return bytes;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  HttpResponse& r = *t.response;
  const bool success = r.status >= 200 && r.status < 300;
  if (success && t.target->buffer) {
    // Exactly into the caller's buffer: a body longer than asked for stops
    // the transfer before a byte lands outside it.
    if (bytes > t.target->capacity - r.body_bytes) {
      r.body_overflow = true;
      return 0;
    }
    std::memcpy(static_cast<char*>(t.target->buffer) + r.body_bytes, data, bytes);
    r.body_bytes += bytes;
    return bytes;
  }
  const size_t limit = success ? t.target->text_limit : kMaxErrorBody;
  const size_t keep = std::min(bytes, limit - std::min(limit, r.body.size()));
  r.body.append(data, keep);
  r.body_bytes += bytes;
  if (keep < bytes && success && t.target->text_limit > 0) {
    r.body_overflow = true;  // a result document larger than any S3 sends
    return 0;
  }
  return bytes;  // an error document's tail, or a body nobody reads, is dropped
}

size_t on_read(char* out, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t n = std::min(size * count, t.request->body_size - t.sent);
  if (n > 0) std::memcpy(out, static_cast<const char*>(t.request->body) + t.sent, n);
  t.sent += n;
  return n;
}

// libcurl re-sends a request by itself when a reused connection dies before
// any answer. A request with a body it must rewind for that; refusing makes
// the re-send the client's own retry instead: counted, signed afresh, and
// known to the operations that must ask whether an earlier attempt took
// effect (a conditional PUT, CompleteMultipartUpload).
int on_seek(void* user, curl_off_t offset, int origin) {
  auto& t = *static_cast<Transfer*>(user);
  if (origin == SEEK_SET && offset == 0 && t.sent == 0) return CURL_SEEKFUNC_OK;  // nothing sent yet
  return CURL_SEEKFUNC_CANTSEEK;
}

struct HeaderList {
  curl_slist* list = nullptr;
  ~HeaderList() { curl_slist_free_all(list); }
  void add(const std::string& line) {
    curl_slist* grown = curl_slist_append(list, line.c_str());
    if (!grown) throw Error("libcurl: out of memory for request headers");
    list = grown;
  }
};

}  // namespace

struct HttpClient::Handle {
  CURL* curl = nullptr;
  ~Handle() {
    if (curl) curl_easy_cleanup(curl);
  }
};

HttpClient::HttpClient(Timeouts timeouts, std::string ca_bundle, size_t max_idle_handles)
    : timeouts_(timeouts), ca_bundle_(std::move(ca_bundle)), max_idle_handles_(max_idle_handles) {
  std::call_once(curl_initialized, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error("libcurl: curl_global_init failed");
  });
}

HttpClient::~HttpClient() = default;

std::unique_ptr<HttpClient::Handle> HttpClient::acquire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      std::unique_ptr<Handle> handle = std::move(idle_.back());
      idle_.pop_back();
      curl_easy_reset(handle->curl);  // options back to defaults; live connections stay
      return handle;
    }
  }
  auto handle = std::make_unique<Handle>();
  handle->curl = curl_easy_init();
  if (!handle->curl) throw Error("libcurl: curl_easy_init failed");
  return handle;
}

void HttpClient::release(std::unique_ptr<Handle> handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_.size() < max_idle_handles_) idle_.push_back(std::move(handle));
}

std::optional<TransportError> HttpClient::perform(const HttpRequest& request, const BodyTarget& target,
                                                  HttpResponse& response) {
  response = HttpResponse{};
  std::unique_ptr<Handle> handle = acquire();
  CURL* curl = handle->curl;
  Transfer transfer{&request, &target, &response};

  HeaderList headers;
  for (const auto& [name, value] : request.headers) headers.add(name + ": " + value);
  headers.add("Expect:");  // no 100-continue round trip: S3 answers errors before reading a body anyway
  headers.add("Accept:");

  char error_text[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);        // many threads: no SIGALRM-based DNS timeouts
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);  // redirects are region errors, reported as such
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "distckpt/" DISTCKPT_VERSION);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeouts_.connect.count()));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(timeouts_.stall.count()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeouts_.request.count()));
  if (!ca_bundle_.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca_bundle_.c_str());
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);

  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT" || request.method == "POST") {
    // An upload from memory, with its length known (Content-Length, no chunking).
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body_size));
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(curl, CURLOPT_READDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &transfer);
    if (request.method == "POST") curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }

  const CURLcode code = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  // The handle goes back to the pool whatever happened: curl drops a broken connection itself.
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  release(std::move(handle));

  if (code == CURLE_OK || (code == CURLE_WRITE_ERROR && response.body_overflow)) {
    response.status = status;
    return std::nullopt;
  }
  TransportError error;
  error.curl_code = static_cast<int>(code);
  error.message = error_text[0] ? std::string(error_text) : std::string(curl_easy_strerror(code));
  error.retryable = retryable_curl_code(code);
  return error;
}

}  // namespace distckpt::s3
