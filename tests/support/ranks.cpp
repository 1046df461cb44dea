#include "support/ranks.h"

#include <ATen/Parallel.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "distckpt/comm/process_group.h"

void run_ranks(int world_size, const std::function<void(distckpt::Communicator&)>& body, std::chrono::seconds timeout) {
  if (world_size < 1) throw std::invalid_argument("run_ranks: world_size must be at least 1");
  // A store per call: repeated calls in one test binary never see each other's keys.
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);

  distckpt::ProcessGroupOptions options;
  options.timeout = timeout;
  options.gloo_hostname = "127.0.0.1";  // never depend on the machine's host name in tests

  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  // Communicators outlive every rank's body: a rank that finishes (or throws)
  // early must not close its connections while peers still set up or use theirs.
  std::vector<std::shared_ptr<distckpt::Communicator>> comms(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      // Ranks share the machine's few cores; intra-op threads would oversubscribe them.
      at::set_num_threads(1);
      try {
        auto& comm = comms[static_cast<size_t>(rank)];
        comm = distckpt::communicator_from_store(store, rank, world_size, options);
        body(*comm);
      } catch (...) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  comms.clear();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

std::string make_temp_dir(const std::string& tag) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string base = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
  std::string safe_tag = tag;
  for (char& c : safe_tag) {
    if (c == '/' || c == ' ') c = '_';
  }
  std::string path = base + "/distckpt-" + safe_tag + "-XXXXXX";
  if (mkdtemp(path.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "make_temp_dir: mkdtemp " + path);
  }
  return path;
}

TempDir::TempDir(const std::string& tag) : path_(make_temp_dir(tag)) {}

TempDir::~TempDir() {
  std::error_code ignored;  // a destructor must not throw; leftovers in /tmp are harmless
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::file(const std::string& name) const { return path_ + "/" + name; }

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) throw std::runtime_error("flip_byte: cannot open " + path);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x11);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  if (!f) throw std::runtime_error("flip_byte: cannot rewrite byte " + std::to_string(offset) + " of " + path);
}
