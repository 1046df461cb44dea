// Where and how to reach S3, resolved as the AWS tools resolve it:
//
//   endpoint     AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
//                [services NAME] s3.endpoint_url, its endpoint_url, else
//                https://s3.REGION.amazonaws.com (all but the last ignored
//                under AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true)
//   credentials  AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
//                else the profile's section of the credentials file, else of
//                the config file
//   region       AWS_REGION, AWS_DEFAULT_REGION, the profile's region, us-east-1
//   profile      AWS_PROFILE (or the older AWS_DEFAULT_PROFILE), else "default";
//                files AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) and
//                AWS_CONFIG_FILE (~/.aws/config)
//   addressing   DISTCKPT_S3_ADDRESSING=path|virtual, the profile's
//                s3.addressing_style, else virtual-hosted on amazonaws.com and
//                path-style on any other endpoint (MinIO, moto, Ceph)
//   retries      AWS_MAX_ATTEMPTS or the profile's max_attempts (default 8)
//   TLS          AWS_CA_BUNDLE or the profile's ca_bundle
//
// Only static credentials are read: roles, SSO and credential_process are
// not (export them first: `aws configure export-credentials --format env`).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "storage/s3/sigv4.h"

namespace distckpt::s3 {

enum class Addressing { kPath, kVirtualHosted };

struct Endpoint {
  std::string scheme;  // "https" or "http" (only when the URL says so)
  std::string host;    // "s3.us-east-1.amazonaws.com", "127.0.0.1", "[::1]"
  int port = 0;        // 0: the scheme's default

  std::string authority() const;  // host[:port], the Host header
  std::string url() const;        // scheme://host[:port]
  bool is_aws() const;            // an amazonaws.com host
  bool host_is_ip() const;
};

// Throws UsageError unless `url` is http(s)://HOST[:PORT][/].
Endpoint parse_endpoint_url(const std::string& url);

struct RetryPolicy {
  int max_attempts = 8;                          // the first attempt included
  std::chrono::milliseconds max_elapsed{30000};  // no retry starts after this long
  std::chrono::milliseconds base_delay{100};     // the first backoff's ceiling, doubled per attempt
  std::chrono::milliseconds max_delay{5000};     // the ceiling of any one backoff
};

struct Timeouts {
  std::chrono::milliseconds connect{10000};
  std::chrono::seconds stall{30};        // slower than 1 KiB/s for this long: abandoned and retried
  std::chrono::milliseconds request{0};  // a whole exchange; 0: no limit (the stall check guards it)
};

struct Config {
  Endpoint endpoint;
  std::string region;
  Credentials credentials;
  Addressing addressing = Addressing::kPath;
  RetryPolicy retry;
  Timeouts timeouts;
  std::string ca_bundle;  // a CA file for TLS; empty: the system's

  // Where the settings came from, for messages that say what to change.
  std::string profile;             // the profile the files were read for
  std::string credentials_source;  // "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" or "[NAME] of PATH"
  std::string region_source;       // "AWS_REGION", "profile NAME of PATH" or "default"
  std::string endpoint_source;
};

// The process environment as resolution sees it (tests build their own).
struct Environment {
  std::map<std::string, std::string> variables;

  // The variables above and HOME, from the process environment.
  static Environment current();
  // nullopt when unset or empty (an empty variable counts as unset, as in the AWS CLI).
  std::optional<std::string> get(const std::string& name) const;
};

// Throws UsageError for missing credentials (saying which variables or files
// to set), a profile that AWS_PROFILE names but no file holds, malformed
// files, endpoints, regions or settings.
Config resolve_config(const Environment& environment = Environment::current());

}  // namespace distckpt::s3
