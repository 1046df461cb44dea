// run_agreed / agree_on_errors: a failure on one rank becomes the same error
// on every rank: one class, chosen by ErrorKind's order from what the failed
// ranks saw, one message, and the per-rank reports as data.
#include "comm/agreement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/errors.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs `f`, which must throw exactly E (not a subclass), and returns it.
template <typename E, typename F>
E caught(F&& f) {
  try {
    f();
  } catch (const E& e) {
    EXPECT_EQ(typeid(e), typeid(E)) << "threw " << typeid(e).name() << ": " << e.what();
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << " instead of " << typeid(E).name() << ": " << e.what();
    throw;
  }
  ADD_FAILURE() << "nothing was thrown (expected " << typeid(E).name() << ")";
  throw std::logic_error("nothing thrown");
}

TEST(CommAgreementTest, OneFailingRankFailsEveryRankWithItsClass) {
  const std::string original = "shard of 'decoder.weight' overlaps at offset [4, 0]";
  run_ranks(4, [&](Communicator& comm) {
    const ShardingError e = caught<ShardingError>([&] {
      run_agreed(comm, "validate plan", [&] {
        if (comm.rank() == 2) throw ShardingError(original);
      });
    });
    // Every rank the same text, the failing one included.
    EXPECT_EQ(std::string(e.what()), "validate plan failed on rank(s) 2: rank 2 (ShardingError): " + original);
    ASSERT_EQ(e.failures().size(), 1u);
    EXPECT_EQ(e.failures()[0].rank, 2);
    EXPECT_EQ(e.failures()[0].kind, ErrorKind::kSharding);
    EXPECT_EQ(e.failures()[0].message, original);
    EXPECT_TRUE(e.agreed());
  });
}

TEST(CommAgreementTest, TheClassIsTheEarliestKindAnyRankSawWithItsFileAndErrno) {
  // Rank 0: a consequence (its peer's failure); rank 1: I/O; rank 2: corruption.
  run_ranks(4, [](Communicator& comm) {
    std::exception_ptr error;
    if (comm.rank() == 0) error = std::make_exception_ptr(CommError("peer went away"));
    if (comm.rank() == 1) error = std::make_exception_ptr(IoError("write to '/d/x' failed", "/d/x", ENOSPC));
    if (comm.rank() == 2) error = std::make_exception_ptr(CorruptionError("checksum mismatch in '/d/y'", "/d/y"));
    const CorruptionError e = caught<CorruptionError>([&] { agree_on_errors(comm, "load", error); });
    EXPECT_EQ(e.path(), "/d/y");  // the chosen failure's file
    ASSERT_EQ(e.failures().size(), 3u);
    EXPECT_EQ(e.failures()[0].kind, ErrorKind::kComm);
    EXPECT_EQ(e.failures()[1].kind, ErrorKind::kIo);
    EXPECT_EQ(e.failures()[1].path, "/d/x");
    EXPECT_EQ(e.failures()[1].error_number, ENOSPC);
    EXPECT_EQ(e.failures()[2].rank, 2);
    EXPECT_THAT(e.what(), HasSubstr("load failed on rank(s) 0-2: rank 0 (CommError): peer went away; rank 1 "
                                    "(IoError): write to '/d/x' failed; rank 2 (CorruptionError): checksum"));
  });
  // Without corruption, I/O comes before the communication failure.
  run_ranks(2, [](Communicator& comm) {
    std::exception_ptr error = comm.rank() == 0 ? std::make_exception_ptr(TimeoutError("waited"))
                                                : std::make_exception_ptr(IoError("EIO", "/f", EIO));
    const IoError e = caught<IoError>([&] { agree_on_errors(comm, "read", error); });
    EXPECT_EQ(e.error_number(), EIO);
  });
}

TEST(CommAgreementTest, ExceptionsFromOutsideDistckptBecomeError) {
  run_ranks(2, [](Communicator& comm) {
    const Error e = caught<Error>([&] {
      run_agreed(comm, "copy", [&] {
        if (comm.rank() == 1) throw std::out_of_range("index 9 is out of bounds");
      });
    });
    EXPECT_THAT(e.what(), HasSubstr("rank 1 (Error): index 9 is out of bounds"));
  });
}

TEST(CommAgreementTest, AnErrorAlreadyAgreedIsRaisedAgainUnchanged) {
  run_ranks(3, [](Communicator& comm) {
    const KeyMismatchError e = caught<KeyMismatchError>([&] {
      run_agreed(comm, "outer step", [&] {
        run_agreed(comm, "inner step", [&] {
          if (comm.rank() == 1) throw KeyMismatchError("'w' is not stored");
        });
      });
    });
    EXPECT_EQ(std::string(e.what()), "inner step failed on rank(s) 1: rank 1 (KeyMismatchError): 'w' is not stored");
  });
}

TEST(CommAgreementTest, AllToAllCarriesPartsOrEveryRanksFailure) {
  run_ranks(3, [](Communicator& comm) {
    const std::vector<std::string> got = all_to_all_agreed(comm, "route", [&] {
      std::vector<std::string> parts;
      for (int to = 0; to < 3; ++to)
        parts.push_back(to == 1 ? "" : std::to_string(comm.rank()) + ">" + std::to_string(to));
      return parts;
    });
    const std::string me = std::to_string(comm.rank());
    EXPECT_EQ(got, comm.rank() == 1 ? std::vector<std::string>(3)
                                    : (std::vector<std::string>{"0>" + me, "1>" + me, "2>" + me}));
    const ShardingError e = caught<ShardingError>([&] {
      all_to_all_agreed(comm, "plan keys", [&] {
        if (comm.rank() == 0) throw ShardingError("'w' is covered twice");
        return std::vector<std::string>(3, "x");
      });
    });
    EXPECT_THAT(e.what(), HasSubstr("plan keys failed on rank(s) 0: rank 0 (ShardingError): 'w' is covered twice"));
  });
}

TEST(CommAgreementTest, GatherCarriesBytesOrEveryRanksFailure) {
  run_ranks(2, [](Communicator& comm) {
    EXPECT_EQ(gather_agreed(comm, "describe", [&] { return std::to_string(comm.rank()); }),
              (std::vector<std::string>{"0", "1"}));
    const UsageError e = caught<UsageError>([&] {
      gather_agreed(comm, "describe", [&]() -> std::string {
        if (comm.rank() == 1) throw UsageError("io_threads is -1");
        return "ok";
      });
    });
    EXPECT_EQ(e.failures().size(), 1u);
  });
}

TEST(CommAgreementTest, SuccessEverywhereThrowsNothing) {
  std::atomic<int> steps{0};
  run_ranks(3, [&](Communicator& comm) {
    run_agreed(comm, "write", [&] { steps.fetch_add(1); });
    agree_on_errors(comm, "finalize", nullptr);
  });
  EXPECT_EQ(steps.load(), 3);
}

TEST(CommAgreementTest, SeveralFailuresAreAllNamed) {
  run_ranks(4, [](Communicator& comm) {
    std::exception_ptr error;
    if (comm.rank() % 2 == 1) {
      error = std::make_exception_ptr(CheckpointError("disk full on rank " + std::to_string(comm.rank())));
    }
    const CheckpointError e = caught<CheckpointError>([&] { agree_on_errors(comm, "write data files", error); });
    EXPECT_EQ(std::string(e.what()),
              "write data files failed on rank(s) 1, 3: rank 1 (CheckpointError): disk full on rank 1; "
              "rank 3 (CheckpointError): disk full on rank 3");
  });
}

TEST(CommAgreementTest, AWorldOfOneRaisesItsOwnErrorUnchanged) {
  run_ranks(1, [](Communicator& comm) {
    const IoError e = caught<IoError>([&] {
      run_agreed(comm, "write", [] { throw IoError("fsync of '/f' failed: Input/output error", "/f", EIO); });
    });
    EXPECT_EQ(std::string(e.what()), "fsync of '/f' failed: Input/output error");
  });
}

// Statuses as if all-gathered from a large job, to check the report's bounds.
class CannedStatuses final : public Communicator {
 public:
  explicit CannedStatuses(std::vector<std::string> statuses) : statuses_(std::move(statuses)) {}
  int rank() const override { return 0; }
  int size() const override { return static_cast<int>(statuses_.size()); }
  std::string backend() const override { return "canned"; }
  std::vector<std::string> all_gather_bytes(std::string_view) override { return statuses_; }
  std::string broadcast_bytes(std::string_view, int) override { return {}; }
  std::vector<std::string> gather_bytes(std::string_view, int) override { return {}; }
  std::string scatter_bytes(const std::vector<std::string>&, int) override { return {}; }
  std::vector<std::string> all_to_all_bytes(const std::vector<std::string>&) override { return statuses_; }
  void barrier() override {}
  void broadcast_tensor(at::Tensor&, int) override {}
  void send_tensor(const at::Tensor&, int, int) override {}
  void recv_tensor(at::Tensor&, int, int) override {}

 private:
  std::vector<std::string> statuses_;
};

// A failure report as a peer encodes it (comm/agreement.cpp).
std::string report(ErrorKind kind, const std::string& message) {
  std::string out = {'F', static_cast<char>(kind), 0, 0, 0, 0, 0, 0, 0, 0, 0};
  return out + message;
}

TEST(CommAgreementTest, ReportsStayBoundedForManyFailures) {
  std::vector<std::string> statuses(1000, report(ErrorKind::kIo, std::string(5000, 'm')));
  statuses[0] = "";  // this rank succeeded
  CannedStatuses comm(statuses);
  const IoError e = caught<IoError>([&] { agree_on_errors(comm, "load", nullptr); });
  const std::string message = e.what();
  EXPECT_THAT(message, HasSubstr("load failed on rank(s) 1-999: rank 1 (IoError): "));
  EXPECT_THAT(message, HasSubstr("rank 8 (IoError): "));
  EXPECT_THAT(message, Not(HasSubstr("rank 9 (")));
  EXPECT_THAT(message, HasSubstr("and 991 more"));
  EXPECT_LT(message.size(), 8u * 5000u + 1000u);
  EXPECT_EQ(e.failures().size(), 999u);  // every failed rank, as data
}

TEST(CommAgreementTest, AMalformedReportIsAProtocolErrorNamingTheRank) {
  CannedStatuses comm({"", "garbage", report(static_cast<ErrorKind>(200), "x")});
  const ProtocolError e = caught<ProtocolError>([&] { agree_on_errors(comm, "save", nullptr); });
  EXPECT_THAT(e.what(), HasSubstr("rank 1 (ProtocolError): a malformed failure report (7 bytes)"));
  EXPECT_THAT(e.what(), HasSubstr("rank 2 (ProtocolError): a malformed failure report"));
}

TEST(CommAgreementTest, LongLocalMessagesAreTruncatedBeforeSending) {
  run_ranks(2, [](Communicator& comm) {
    std::exception_ptr error;
    if (comm.rank() == 0) error = std::make_exception_ptr(Error(std::string(100000, 'x')));
    const Error e = caught<Error>([&] { agree_on_errors(comm, "stage", error); });
    EXPECT_THAT(e.what(), HasSubstr("(truncated)"));
    EXPECT_LT(std::string(e.what()).size(), 2200u);
  });
}

}  // namespace
}  // namespace distckpt
