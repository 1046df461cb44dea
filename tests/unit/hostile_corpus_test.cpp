// The corpus of damaged and hostile checkpoints in tests/data/hostile, which
// the Python package opens too (python/tests/test_hostile_corpus.py): each
// case raises the class cases.json names, here and there, when every tensor
// and the common state are read (as a conversion would), and verify gives
// the status it names.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "distckpt/distckpt.h"
#include "io/file.h"

namespace distckpt {
namespace {

const std::string kCorpus = DISTCKPT_SOURCE_DIR "/tests/data/hostile";

struct Expected {
  std::string error;   // the class
  std::string verify;  // status_name of verify's report
};

std::map<std::string, Expected> cases() {
  const nlohmann::json j = nlohmann::json::parse(io::read_file(kCorpus + "/cases.json", 1 << 20));
  std::map<std::string, Expected> out;
  for (const auto& [name, c] : j.items()) out[name] = {c.at("error"), c.at("verify")};
  return out;
}

TEST(HostileCorpus, EveryCaseRaisesItsClass) {
  const std::map<std::string, Expected> expected = cases();
  ASSERT_GE(expected.size(), 15u);
  for (const auto& [name, want] : expected) {
    const std::string dir = kCorpus + "/" + name;
    std::string raised = "(nothing)", message;
    try {
      load_plain_tensors(dir);
      load_common_state_dict(dir);
    } catch (const std::exception& e) {
      raised = error_class_name(error_kind_of(e));
      message = e.what();
    }
    EXPECT_EQ(raised, want.error) << name << ": " << message;
    const VerifyReport report = verify_checkpoint(dir);
    EXPECT_EQ(status_name(report.status), want.verify) << name << ": " << ::testing::PrintToString(report.problems);
  }
}

}  // namespace
}  // namespace distckpt
