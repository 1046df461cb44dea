// S3 servers for the tests: moto_server (moto 5) with SigV4 checking on, and
// tests/support/fault_proxy.py in front of it to inject faults.
//
// The moto server is started once per test process, on a free loopback port,
// with INITIAL_NO_AUTH_ACTION_COUNT=3: s3_server.py spends those three
// unauthenticated requests on an IAM user allowed everything and an access
// key for it, then creates the bucket with that key; every request after that
// must carry a valid signature. Without moto_server, tests skip in one line.
//
// moto 5.2 checks a signature against the URL as its web framework decoded
// it, so with checks on, a key holding characters other than unreserved ones,
// '/' and ' ', or a query value holding any but unreserved ones (a '/' in a
// ListObjectsV2 prefix), fails there for every client, boto3 included (real
// S3 does not). Tests of such keys use a second server that checks none;
// their signatures are checked against botocore's (s3_sigv4_test.cpp).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "storage/s3/config.h"

// A process the tests started, in a process group of its own, killed with it
// (and when the test process dies: PR_SET_PDEATHSIG).
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_environment,
               const std::string& log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool running();  // false once it has exited
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
};

inline constexpr const char* kMotoMissing = "moto_server (moto 5) not installed: S3 tests skipped";

class MotoServer {
 public:
  enum class Signatures { kChecked, kUnchecked };
  // The test process's server of that kind, started on first use. nullptr
  // when moto_server is not on PATH; throws std::runtime_error (with its
  // log) when it is but does not come up.
  static MotoServer* shared(Signatures signatures = Signatures::kChecked);
  ~MotoServer();

  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& access_key_id() const { return access_key_id_; }
  const std::string& secret_access_key() const { return secret_access_key_; }
  static constexpr const char* kBucket = "distckpt-tests";  // created at start

  // The variables a user sets to reach this server (`endpoint`: a proxy's
  // instead), as "NAME=value NAME=value" for a shell command line.
  std::string shell_environment(const std::string& endpoint = "") const;
  // The same, set in this process (for the library's own calls).
  void export_environment(const std::string& endpoint = "") const;

  // Resolved from environment variables as a user would set them (endpoint,
  // key, region), with short backoffs so that retrying tests stay quick.
  distckpt::s3::Config config() const;
  // The same with `endpoint` (a proxy) in place of the server's.
  distckpt::s3::Config config_via(const std::string& endpoint) const;

 private:
  MotoServer() = default;
  static std::unique_ptr<MotoServer> start(Signatures signatures);
  std::string dir_;  // log files
  int port_ = 0;
  std::string access_key_id_, secret_access_key_;
  std::unique_ptr<ChildProcess> process_;
};

// `size` pseudo-random bytes, the same for the same seed.
std::string random_bytes(size_t size, uint32_t seed);
// The start of keys of the running test's own ("TAG<test name>-N-"), so that
// tests share one server; no '/', which moto's signature check cannot take
// in a ListObjectsV2 prefix.
std::string s3_test_keys(const std::string& tag);

// Skip the test, in one line, where moto_server is not installed.
#define DISTCKPT_REQUIRE_MOTO(server)        \
  MotoServer* server = MotoServer::shared(); \
  if (!server) GTEST_SKIP() << kMotoMissing
#define DISTCKPT_REQUIRE_MOTO_WITHOUT_SIGNATURE_CHECKS(server)                 \
  MotoServer* server = MotoServer::shared(MotoServer::Signatures::kUnchecked); \
  if (!server) GTEST_SKIP() << kMotoMissing

// fault_proxy.py in front of a MotoServer; faults as set_rules() says.
class FaultProxy {
 public:
  explicit FaultProxy(const MotoServer& server);
  ~FaultProxy();

  // The rules, a JSON array (see fault_proxy.py); every rule's count starts over.
  void set_rules(const std::string& rules_array);
  const MotoServer& server() const { return server_; }
  // One line per fault fired since the last set_rules(): "ACTION METHOD PATH?QUERY".
  std::vector<std::string> faults() const;
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  distckpt::s3::Config config() const { return server_.config_via(endpoint()); }

 private:
  const MotoServer& server_;
  std::string dir_;
  int port_ = 0;
  int generation_ = 0;  // makes every rules file differ from the last, so the proxy's counts restart
  std::unique_ptr<ChildProcess> process_;
};
