// Diagnostics of distckpt-gen: "file:line:col: error: message", the source
// line, and a caret under the column. Collected, then rendered sorted by
// position so one run reports every error of a file. An error may carry
// notes that point elsewhere ("note: first declared here"), rendered right
// after it as clang does.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.h"

namespace distckpt::gen {

struct Diagnostic {
  enum class Severity { kError, kWarning, kNote };
  Severity severity = Severity::kError;
  Loc loc;
  std::string message;
  std::vector<Diagnostic> notes;  // each a kNote

  // Attaches a note at `at`; returns *this so notes chain after error().
  Diagnostic& note(Loc at, std::string text);
};

class Diagnostics {
 public:
  Diagnostics(std::string file_name, std::string source);

  // The diagnostic stays valid until the next one is reported: enough to
  // attach its notes, as in error(loc, "...").note(first, "first declared here").
  Diagnostic& error(Loc loc, std::string message);
  Diagnostic& warning(Loc loc, std::string message);
  bool has_errors() const;
  const std::vector<Diagnostic>& all() const { return diagnostics_; }
  // Every diagnostic, sorted by (line, col), each as three lines and
  // followed by its notes in the same form:
  //   gpt.shard:12:41: error: unknown mesh axis 'tq' (mesh axes: tp, pp, dp)
  //     <the source line, tabs kept>
  //     <spaces up to the column>^
  std::string render() const;
  const std::string& file_name() const { return file_name_; }

 private:
  void render_one(const Diagnostic& d, const std::vector<size_t>& line_starts, std::string& out) const;

  std::string file_name_;
  std::string source_;
  std::vector<Diagnostic> diagnostics_;
};

}  // namespace distckpt::gen
