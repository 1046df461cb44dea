// Test support: several ranks in one process, and temporary directories.
//
// run_ranks runs `body` on `world_size` threads, each rank with its own Gloo
// communicator over a shared in-memory store, so multi-rank tests exercise a
// real process group without launching processes.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "distckpt/comm/communicator.h"

// Runs `body(comm)` once per rank and waits for all ranks. If any rank
// throws, the exception of the lowest such rank is rethrown here after all
// threads joined (so EXPECT_THROW works). `timeout` bounds every collective,
// so a rank that throws early makes its peers fail with CommError after at
// most `timeout` instead of hanging.
void run_ranks(int world_size, const std::function<void(distckpt::Communicator&)>& body,
               std::chrono::seconds timeout = std::chrono::seconds(60));

// A fresh, empty directory "<$TMPDIR or /tmp>/distckpt-<tag>-XXXXXX".
std::string make_temp_dir(const std::string& tag);

// Flips bits of the byte at `offset` of an existing file (corruption tests).
void flip_byte(const std::string& path, uint64_t offset);

// A temporary directory removed (recursively) when it goes out of scope.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string file(const std::string& name) const;

 private:
  std::string path_;
};
