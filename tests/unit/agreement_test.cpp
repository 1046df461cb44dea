// run_agreed / agree_on_errors: a failure on one rank becomes an error on
// every rank, with the original exception kept where it happened and bounded
// reports elsewhere.
#include "comm/agreement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/errors.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(CommAgreementTest, OneFailingRankFailsEveryRank) {
  const std::string original = "shard of 'decoder.weight' overlaps at offset [4, 0]";
  run_ranks(4, [&](Communicator& comm) {
    try {
      run_agreed(comm, "validate plan", [&] {
        if (comm.rank() == 2) throw ShardingError(original);
      });
      ADD_FAILURE() << "rank " << comm.rank() << " did not throw";
    } catch (const ShardingError& e) {
      EXPECT_EQ(comm.rank(), 2) << "only the failing rank keeps the original type";
      EXPECT_EQ(e.what(), original);
    } catch (const CommError& e) {
      EXPECT_NE(comm.rank(), 2);
      EXPECT_THAT(e.what(), HasSubstr("validate plan failed on rank(s) 2"));
      EXPECT_THAT(e.what(), HasSubstr("rank 2: " + original));
    }
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
    try {
      all_to_all_agreed(comm, "plan keys", [&] {
        if (comm.rank() == 0) throw ShardingError("'w' is covered twice");
        return std::vector<std::string>(3, "x");
      });
      ADD_FAILURE() << "rank " << comm.rank() << " did not throw";
    } catch (const ShardingError& e) {
      EXPECT_EQ(comm.rank(), 0);
    } catch (const CommError& e) {
      EXPECT_NE(comm.rank(), 0);
      EXPECT_THAT(e.what(), HasSubstr("plan keys failed on rank(s) 0: rank 0: 'w' is covered twice"));
    }
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
    try {
      agree_on_errors(comm, "write data files", error);
      ADD_FAILURE() << "rank " << comm.rank() << " did not throw";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(e.what(), "disk full on rank " + std::to_string(comm.rank()));
    } catch (const CommError& e) {
      EXPECT_EQ(std::string(e.what()),
                "write data files failed on rank(s) 1, 3: rank 1: disk full on rank 1; "
                "rank 3: disk full on rank 3");
    }
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

TEST(CommAgreementTest, ReportsStayBoundedForManyFailures) {
  std::vector<std::string> statuses(1000, std::string(5000, 'm'));
  statuses[0] = "";  // this rank succeeded
  CannedStatuses comm(statuses);
  try {
    agree_on_errors(comm, "load", nullptr);
    FAIL() << "failures elsewhere must throw";
  } catch (const CommError& e) {
    const std::string message = e.what();
    EXPECT_THAT(message, HasSubstr("load failed on rank(s) 1-999: rank 1: "));
    EXPECT_THAT(message, HasSubstr("rank 8: "));
    EXPECT_THAT(message, Not(HasSubstr("rank 9: ")));
    EXPECT_THAT(message, HasSubstr("and 991 more"));
    EXPECT_LT(message.size(), 8u * 5000u + 1000u);
  }
}

TEST(CommAgreementTest, LongLocalMessagesAreTruncatedBeforeSending) {
  run_ranks(2, [](Communicator& comm) {
    std::exception_ptr error;
    if (comm.rank() == 0) error = std::make_exception_ptr(Error(std::string(100000, 'x')));
    try {
      agree_on_errors(comm, "stage", error);
      ADD_FAILURE() << "rank " << comm.rank() << " did not throw";
    } catch (const CommError& e) {
      EXPECT_EQ(comm.rank(), 1);
      EXPECT_THAT(e.what(), HasSubstr("(truncated)"));
      EXPECT_LT(std::string(e.what()).size(), 2200u);
    } catch (const Error& e) {
      EXPECT_EQ(comm.rank(), 0);
      EXPECT_EQ(std::string(e.what()).size(), 100000u);  // the failing rank keeps it whole
    }
  });
}

}  // namespace
}  // namespace distckpt
