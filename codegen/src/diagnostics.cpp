// Collecting and rendering diagnostics (see diagnostics.h for the format).
#include "diagnostics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>

namespace distckpt::gen {
namespace {

// Start offsets of every line, so each diagnostic finds its line directly.
std::vector<size_t> line_starts(std::string_view source) {
  std::vector<size_t> starts{0};
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\n') starts.push_back(i + 1);
  }
  return starts;
}

std::string_view line_text(std::string_view source, const std::vector<size_t>& starts, int line) {
  if (line < 1 || static_cast<size_t>(line) > starts.size()) return {};
  const size_t begin = starts[static_cast<size_t>(line) - 1];
  size_t end = source.find('\n', begin);
  if (end == std::string_view::npos) end = source.size();
  if (end > begin && source[end - 1] == '\r') --end;  // CRLF files
  return source.substr(begin, end - begin);
}

// Spaces up to the column, except that a tab in the source line stays a tab,
// so the caret lines up however the terminal expands tabs.
std::string caret_line(std::string_view text, int col) {
  std::string caret;
  for (int i = 0; i + 1 < col; ++i) {
    const size_t at = static_cast<size_t>(i);
    caret += (at < text.size() && text[at] == '\t') ? '\t' : ' ';
  }
  caret += '^';
  return caret;
}

}  // namespace

Diagnostics::Diagnostics(std::string file_name, std::string source)
    : file_name_(std::move(file_name)), source_(std::move(source)) {}

Diagnostic& Diagnostic::note(Loc at, std::string text) {
  notes.push_back(Diagnostic{Severity::kNote, at, std::move(text), {}});
  return *this;
}

Diagnostic& Diagnostics::error(Loc loc, std::string message) {
  return diagnostics_.emplace_back(Diagnostic{Diagnostic::Severity::kError, loc, std::move(message), {}});
}

Diagnostic& Diagnostics::warning(Loc loc, std::string message) {
  return diagnostics_.emplace_back(Diagnostic{Diagnostic::Severity::kWarning, loc, std::move(message), {}});
}

bool Diagnostics::has_errors() const {
  return std::any_of(diagnostics_.begin(), diagnostics_.end(),
                     [](const Diagnostic& d) { return d.severity == Diagnostic::Severity::kError; });
}

std::string Diagnostics::render() const {
  std::vector<const Diagnostic*> sorted;
  sorted.reserve(diagnostics_.size());
  for (const Diagnostic& d : diagnostics_) sorted.push_back(&d);
  // Stable: diagnostics at one position keep the order they were found in.
  std::stable_sort(sorted.begin(), sorted.end(), [](const Diagnostic* a, const Diagnostic* b) {
    return std::make_pair(a->loc.line, a->loc.col) < std::make_pair(b->loc.line, b->loc.col);
  });
  const std::vector<size_t> starts = line_starts(source_);
  std::string out;
  for (const Diagnostic* d : sorted) {
    render_one(*d, starts, out);
    for (const Diagnostic& note : d->notes) render_one(note, starts, out);
  }
  return out;
}

void Diagnostics::render_one(const Diagnostic& d, const std::vector<size_t>& starts, std::string& out) const {
  const char* severity = d.severity == Diagnostic::Severity::kError     ? "error"
                         : d.severity == Diagnostic::Severity::kWarning ? "warning"
                                                                        : "note";
  if (d.loc.line < 1) {  // not tied to a position
    out += fmt::format("{}: {}: {}\n", file_name_, severity, d.message);
    return;
  }
  const std::string_view text = line_text(source_, starts, d.loc.line);
  out += fmt::format("{}:{}:{}: {}: {}\n", file_name_, d.loc.line, d.loc.col, severity, d.message);
  out += fmt::format("{}\n{}\n", text, caret_line(text, d.loc.col));
}

}  // namespace distckpt::gen
