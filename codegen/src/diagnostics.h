// Diagnostics of distckpt-gen: "file:line:col: error: message", the source
// line, and a caret under the column. Collected, then rendered sorted by
// position so one run reports every error of a file.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.h"

namespace distckpt::gen {

struct Diagnostic {
  enum class Severity { kError, kWarning };
  Severity severity = Severity::kError;
  Loc loc;
  std::string message;
};

class Diagnostics {
 public:
  Diagnostics(std::string file_name, std::string source);

  void error(Loc loc, std::string message);
  void warning(Loc loc, std::string message);
  bool has_errors() const;
  const std::vector<Diagnostic>& all() const { return diagnostics_; }
  // Every diagnostic, sorted by (line, col), each as three lines:
  //   gpt.shard:12:41: error: unknown mesh axis 'tq' (mesh axes: tp, pp, dp)
  //     <the source line, tabs kept>
  //     <spaces up to the column>^
  std::string render() const;
  const std::string& file_name() const { return file_name_; }

 private:
  std::string file_name_;
  std::string source_;
  std::vector<Diagnostic> diagnostics_;
};

}  // namespace distckpt::gen
