// Parsing and matching expected-diagnostic directives (see expected_diagnostics.h).
#include "expected_diagnostics.h"

#include <fmt/format.h>

#include <regex>
#include <sstream>

namespace distckpt::gen::testing {
namespace {

const char* severity_name(Diagnostic::Severity severity) {
  switch (severity) {
    case Diagnostic::Severity::kError:
      return "error";
    case Diagnostic::Severity::kWarning:
      return "warning";
    case Diagnostic::Severity::kNote:
      return "note";
  }
  return "?";
}

Diagnostic::Severity severity_of(const std::string& name) {
  if (name == "warning") return Diagnostic::Severity::kWarning;
  if (name == "note") return Diagnostic::Severity::kNote;
  return Diagnostic::Severity::kError;
}

bool matches(const Expectation& e, const Diagnostic& d) {
  return e.severity == d.severity && e.line == d.loc.line && (e.col == 0 || e.col == d.loc.col) &&
         d.message.find(e.text) != std::string::npos;
}

std::string describe(const Expectation& e) {
  return fmt::format("{}:{}: {} {{{{{}}}}} (written on line {})", e.line, e.col == 0 ? "*" : std::to_string(e.col),
                     severity_name(e.severity), e.text, e.written_at);
}

}  // namespace

std::vector<Expectation> parse_expectations(const std::string& source, std::vector<std::string>& malformed) {
  // expected-SEVERITY[@[+-]LINE][:COL] {{TEXT}}
  static const std::regex directive(R"(expected-(error|warning|note)(@([+-]?)(\d+))?(:(\d+))?\s*\{\{(.*?)\}\})");
  std::vector<Expectation> out;
  std::istringstream lines(source);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const size_t hash = line.find('#');
    if (hash == std::string::npos) continue;
    const std::string comment = line.substr(hash);
    for (size_t at = comment.find("expected-"); at != std::string::npos; at = comment.find("expected-", at + 1)) {
      std::smatch m;
      const std::string rest = comment.substr(at);
      if (!std::regex_search(rest, m, directive, std::regex_constants::match_continuous)) {
        malformed.push_back(fmt::format("line {}: not a directive: {}", number, rest));
        continue;
      }
      Expectation e;
      e.severity = severity_of(m[1]);
      e.line = number;
      if (m[2].matched) {
        const int value = std::stoi(m[4]);
        e.line = m[3] == "+" ? number + value : m[3] == "-" ? number - value : value;
      }
      if (m[5].matched) e.col = std::stoi(m[6]);
      e.text = m[7];
      e.written_at = number;
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::vector<std::string> unmatched(const std::vector<Expectation>& expected, const Diagnostics& reported) {
  std::vector<const Diagnostic*> seen;
  for (const Diagnostic& d : reported.all()) {
    seen.push_back(&d);
    for (const Diagnostic& note : d.notes) seen.push_back(&note);
  }
  std::vector<bool> used(seen.size(), false);
  std::vector<std::string> problems;
  for (const Expectation& e : expected) {
    bool found = false;
    for (size_t i = 0; i < seen.size() && !found; ++i) {
      if (!used[i] && matches(e, *seen[i])) used[i] = found = true;
    }
    if (!found) problems.push_back("expected but not reported: " + describe(e));
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (used[i]) continue;
    problems.push_back(fmt::format("reported but not expected: {}:{}: {}: {}", seen[i]->loc.line, seen[i]->loc.col,
                                   severity_name(seen[i]->severity), seen[i]->message));
  }
  return problems;
}

}  // namespace distckpt::gen::testing
