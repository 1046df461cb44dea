#include "support/s3_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/process.h"
#include "support/ranks.h"

namespace {

using namespace std::chrono_literals;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string tail(const std::string& text, size_t bytes = 4000) {
  return text.size() <= bytes ? text : text.substr(text.size() - bytes);
}

// A port nobody listens on now (the kernel's pick; another process may take
// it before the server binds, which then fails and is started again).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) close(fd);
    throw std::runtime_error("no free loopback port");
  }
  close(fd);
  return ntohs(address.sin_port);
}

// A TCP connect, not an HTTP request: moto counts every request against its
// three unauthenticated ones.
bool accepts_connections(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

bool on_path(const std::string& program) { return run_command("command -v " + program + " >/dev/null").exit_code == 0; }

std::string support_file(const char* name) { return std::string(DISTCKPT_SOURCE_DIR) + "/tests/support/" + name; }

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_environment,
                           const std::string& log_path) {
  // Everything the child needs is made before fork(): after it, in a
  // threaded process, only async-signal-safe calls are allowed.
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> environment_text(extra_environment);
  for (char** variable = environ; *variable; ++variable) environment_text.emplace_back(*variable);
  std::vector<char*> environment;
  for (std::string& variable : environment_text) environment.push_back(variable.data());
  environment.push_back(nullptr);
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) throw std::runtime_error("cannot create " + log_path);
  const pid_t parent = getpid();

  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the test process died before prctl
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execvpe(args[0], args.data(), environment.data());
    _exit(127);
  }
  close(log);
  if (pid_ < 0) throw std::runtime_error("fork failed");
  setpgid(pid_, pid_);  // also here, so that the group exists whichever side runs first
}

bool ChildProcess::running() {
  if (exited_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) exited_ = true;
  return !exited_;
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0 || !running()) return;
  kill(-pid_, SIGTERM);
  for (int i = 0; i < 50 && running(); ++i) std::this_thread::sleep_for(100ms);
  if (running()) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

MotoServer* MotoServer::shared(Signatures signatures) {
  static const bool installed = on_path("moto_server");
  if (!installed) return nullptr;
  static std::unique_ptr<MotoServer> servers[2];
  static std::string failures[2];
  const int kind = signatures == Signatures::kChecked ? 0 : 1;
  if (!servers[kind]) {
    if (!failures[kind].empty()) throw std::runtime_error(failures[kind]);
    try {
      servers[kind] = start(signatures);
    } catch (const std::exception& e) {
      failures[kind] = e.what();  // not tried again by every later test
      throw;
    }
  }
  return servers[kind].get();
}

std::unique_ptr<MotoServer> MotoServer::start(Signatures signatures) {
  auto server = std::unique_ptr<MotoServer>(new MotoServer());
  server->dir_ = make_temp_dir("moto");
  const std::string log = server->dir_ + "/moto.log";
  std::vector<std::string> environment;
  if (signatures == Signatures::kChecked) environment.emplace_back("INITIAL_NO_AUTH_ACTION_COUNT=3");
  for (int attempt = 0; attempt < 3; ++attempt) {
    server->port_ = free_port();
    server->process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"moto_server", "-H", "127.0.0.1", "-p", std::to_string(server->port_)}, environment,
        log);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (server->process_->running() && !accepts_connections(server->port_) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
    }
    if (!server->process_->running() || !accepts_connections(server->port_)) {
      server->process_.reset();  // the port was taken, or it is broken: once more, then give up
      continue;
    }
    const CommandResult bootstrap =
        run_command("python3 " + support_file("s3_server.py") + " " + server->endpoint() + " " + kBucket);
    const size_t last_line = bootstrap.output.rfind('\n', bootstrap.output.size() - 2);
    std::istringstream words(bootstrap.output.substr(last_line == std::string::npos ? 0 : last_line + 1));
    if (bootstrap.exit_code != 0 || !(words >> server->access_key_id_ >> server->secret_access_key_)) {
      throw std::runtime_error("s3_server.py could not prepare moto_server: " + tail(bootstrap.output) +
                               "\nmoto log:\n" + tail(read_file(log)));
    }
    return server;
  }
  throw std::runtime_error("moto_server did not start on a loopback port:\n" + tail(read_file(log)));
}

MotoServer::~MotoServer() {
  process_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

namespace {

std::vector<std::pair<std::string, std::string>> user_environment(const MotoServer& server,
                                                                  const std::string& endpoint) {
  return {{"AWS_ENDPOINT_URL_S3", endpoint.empty() ? server.endpoint() : endpoint},
          {"AWS_ACCESS_KEY_ID", server.access_key_id()},
          {"AWS_SECRET_ACCESS_KEY", server.secret_access_key()},
          {"AWS_REGION", "us-east-1"},
          {"AWS_CONFIG_FILE", "/nonexistent/config"},
          {"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"}};
}

}  // namespace

std::string MotoServer::shell_environment(const std::string& endpoint) const {
  std::string out;
  for (const auto& [name, value] : user_environment(*this, endpoint)) out += name + "=" + value + " ";
  return out;
}

void MotoServer::export_environment(const std::string& endpoint) const {
  for (const auto& [name, value] : user_environment(*this, endpoint)) setenv(name.c_str(), value.c_str(), 1);
}

distckpt::s3::Config MotoServer::config() const { return config_via(endpoint()); }

distckpt::s3::Config MotoServer::config_via(const std::string& endpoint) const {
  distckpt::s3::Environment env;
  env.variables = {{"AWS_ENDPOINT_URL_S3", endpoint},
                   {"AWS_ACCESS_KEY_ID", access_key_id_},
                   {"AWS_SECRET_ACCESS_KEY", secret_access_key_},
                   {"AWS_REGION", "us-east-1"},
                   {"AWS_CONFIG_FILE", "/nonexistent/config"},
                   {"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"}};
  distckpt::s3::Config config = distckpt::s3::resolve_config(env);
  config.retry.base_delay = std::chrono::milliseconds(2);
  config.retry.max_delay = std::chrono::milliseconds(20);
  return config;
}

FaultProxy::FaultProxy(const MotoServer& server) : server_(server), dir_(make_temp_dir("fault-proxy")) {
  set_rules("[]");
  const std::string port_file = dir_ + "/port";
  process_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{"python3", support_file("fault_proxy.py"), "--upstream",
                               "127.0.0.1:" + std::to_string(server.port()), "--rules", dir_ + "/rules.json", "--log",
                               dir_ + "/faults.log", "--port-file", port_file},
      std::vector<std::string>{}, dir_ + "/proxy.log");
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (process_->running() && !std::filesystem::exists(port_file) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  if (!std::filesystem::exists(port_file)) {
    throw std::runtime_error("fault_proxy.py did not start:\n" + tail(read_file(dir_ + "/proxy.log")));
  }
  port_ = std::stoi(read_file(port_file));
}

FaultProxy::~FaultProxy() {
  process_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void FaultProxy::set_rules(const std::string& rules_array) {
  // Written whole and renamed, so that the proxy never reads half a file.
  const std::string path = dir_ + "/rules.json";
  std::ofstream(dir_ + "/faults.log", std::ios::trunc);  // faults() reports this rule set's only
  {
    std::ofstream out(path + ".tmp");
    out << "{\"generation\": " << ++generation_ << ", \"rules\": " << rules_array << "}\n";
  }
  std::filesystem::rename(path + ".tmp", path);
}

std::vector<std::string> FaultProxy::faults() const {
  std::vector<std::string> lines;
  std::istringstream text(read_file(dir_ + "/faults.log"));
  for (std::string line; std::getline(text, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

std::string random_bytes(size_t size, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

std::string s3_test_keys(const std::string& tag) {
  static std::atomic<int> runs{0};  // a test repeated in one process (--gtest_repeat) starts afresh
  return tag + testing::UnitTest::GetInstance()->current_test_info()->name() + "-" + std::to_string(++runs) + "-";
}
