// The checker's error cases as annotated schemas: tests/codegen/errors/*.shard,
// one test per file. Each file is compiled, and the diagnostics it reports
// must be exactly those its comments announce, no more and no fewer.
//
// A directive sits in a '#' comment (several may share one):
//
//   expected-error {{text}}          an error on this line whose message contains `text`
//   expected-warning@+1 {{text}}     a warning on the next line (@-2: two lines up; @7: line 7)
//   expected-note@-1:8 {{text}}      a note on the line above, at column 8
//
// Severity is error, warning or note (notes such as "first declared here"
// are matched like any other diagnostic). The column is optional; without
// it any column matches. A comment that says "expected-" but is no
// well-formed directive fails the test, and so does a file without any.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "expected_diagnostics.h"
#include "frontend.h"

namespace distckpt::gen {
namespace {

namespace fs = std::filesystem;

const fs::path kErrorsDir = fs::path(DISTCKPT_SOURCE_DIR) / "tests" / "codegen" / "errors";

std::vector<std::string> annotated_files() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(kErrorsDir)) {
    if (entry.path().extension() == ".shard") files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "stage_ambiguous.shard" -> "stage_ambiguous": gtest names allow [A-Za-z0-9_].
std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = fs::path(info.param).stem().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

class AnnotatedErrors : public ::testing::TestWithParam<std::string> {};

TEST_P(AnnotatedErrors, ReportsExactlyTheAnnotatedDiagnostics) {
  const std::string source = read(kErrorsDir / GetParam());
  ASSERT_FALSE(source.empty()) << GetParam();
  std::vector<std::string> malformed;
  const std::vector<testing::Expectation> expected = testing::parse_expectations(source, malformed);
  EXPECT_TRUE(malformed.empty()) << ::testing::PrintToString(malformed);
  ASSERT_FALSE(expected.empty()) << GetParam() << " announces no diagnostic";

  Diagnostics diagnostics(GetParam(), source);
  compile_schema(GetParam(), source, diagnostics);
  const std::vector<std::string> problems = testing::unmatched(expected, diagnostics);
  std::string listed;
  for (const std::string& p : problems) listed += "  " + p + "\n";
  EXPECT_TRUE(problems.empty()) << GetParam() << ":\n" << listed << "distckpt-gen reported:\n" << diagnostics.render();
}

INSTANTIATE_TEST_SUITE_P(Errors, AnnotatedErrors, ::testing::ValuesIn(annotated_files()), test_name);

// The matcher itself: a wrong annotation must fail, not pass silently.
TEST(ExpectedDiagnostics, MismatchesAreReported) {
  const std::string source =
      "layout t;\n"
      "tensor w [n];  # expected-error:11 {{unknown config parameter 'n'}}\n"
      "tensor v [m];  # expected-error:12 {{unknown config parameter 'm'}} expected-warning {{never}}\n"
      "# expected-eror {{typo}}\n";
  std::vector<std::string> malformed;
  const auto expected = testing::parse_expectations(source, malformed);
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(expected[1].line, 3);
  EXPECT_EQ(expected[1].col, 12);
  ASSERT_EQ(malformed.size(), 1u);
  EXPECT_EQ(malformed[0], "line 4: not a directive: expected-eror {{typo}}");

  Diagnostics diagnostics("t.shard", source);
  compile_schema("t.shard", source, diagnostics);
  EXPECT_EQ(testing::unmatched(expected, diagnostics),
            (std::vector<std::string>{
                "expected but not reported: 3:12: error {{unknown config parameter 'm'}} (written on line 3)",
                "expected but not reported: 3:*: warning {{never}} (written on line 3)",
                "reported but not expected: 3:11: error: unknown config parameter 'm'; declare it in the config "
                "block"}));
}

TEST(ExpectedDiagnostics, RelativeAndAbsoluteLines) {
  std::vector<std::string> malformed;
  const auto expected = testing::parse_expectations(
      "# expected-note@+2 {{a}}\n\n# expected-error@-1:3 {{b}} expected-error@9 {{c}}\n", malformed);
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_TRUE(malformed.empty());
  EXPECT_EQ(expected[0].line, 3);
  EXPECT_EQ(expected[0].severity, Diagnostic::Severity::kNote);
  EXPECT_EQ(expected[1].line, 2);
  EXPECT_EQ(expected[1].col, 3);
  EXPECT_EQ(expected[2].line, 9);
  EXPECT_EQ(expected[2].col, 0);
}

}  // namespace
}  // namespace distckpt::gen
