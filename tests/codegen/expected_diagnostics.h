// Expected diagnostics written into a schema's comments, in the spirit of
// clang's -verify and LLVM lit (the convention is described at the top of
// annotated_errors_test.cpp): parsing the directives, and matching them
// one to one against what the compiler reported.
#pragma once

#include <string>
#include <vector>

#include "diagnostics.h"

namespace distckpt::gen::testing {

struct Expectation {
  Diagnostic::Severity severity = Diagnostic::Severity::kError;
  int line = 0;        // of the diagnostic, absolute
  int col = 0;         // 0: any column
  std::string text;    // a substring of the message
  int written_at = 0;  // the line of the directive itself
};

// Every directive in the comments of `source`. A comment that mentions
// "expected-" without forming a directive is a mistake in the test file and
// goes to `malformed` ("line 7: ...").
std::vector<Expectation> parse_expectations(const std::string& source, std::vector<std::string>& malformed);

// What does not match one to one, each as a line: diagnostics (and notes)
// nobody expected, and expectations nothing matched. Empty: all matched.
std::vector<std::string> unmatched(const std::vector<Expectation>& expected, const Diagnostics& reported);

}  // namespace distckpt::gen::testing
