// Wrapping generated code to the column limit (see wrap.h).
#include "emit/wrap.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <utility>
#include <vector>

namespace distckpt::gen {
namespace {

constexpr size_t kNone = std::string_view::npos;

size_t indentation(std::string_view line) {
  const size_t first = line.find_first_not_of(' ');
  return first == kNone ? line.size() : first;
}

// What a line holds outside its literals.
struct Scan {
  std::vector<bool> literal;  // per character: inside a string or char literal
  size_t comment = kNone;     // where a // comment starts
  std::string raw_open;       // delimiter of a raw string still open at the end
};

Scan scan(std::string_view line) {
  Scan s;
  s.literal.assign(line.size(), false);
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '/' && i + 1 < line.size() && line[i + 1] == '/') {
      s.comment = i;
      break;
    }
    if (c == 'R' && i + 1 < line.size() && line[i + 1] == '"') {
      const size_t open = line.find('(', i + 2);
      if (open == kNone) break;
      const std::string close = ")" + std::string(line.substr(i + 2, open - i - 2)) + "\"";
      const size_t end = line.find(close, open);
      const size_t stop = end == kNone ? line.size() : end + close.size();
      for (size_t j = i; j < stop; ++j) s.literal[j] = true;
      if (end == kNone) s.raw_open = close;
      i = stop - 1;
      continue;
    }
    if (c == '"' || c == '\'') {
      size_t j = i + 1;
      while (j < line.size() && line[j] != c) j += line[j] == '\\' ? 2 : 1;
      for (size_t k = i; k <= j && k < line.size(); ++k) s.literal[k] = true;
      i = j;
    }
  }
  return s;
}

class Wrapper {
 public:
  explicit Wrapper(size_t limit) : limit_(limit) {}

  std::string run(std::string_view text) {
    std::string raw_close;  // set while inside a raw string literal
    for (size_t begin = 0; begin < text.size();) {
      size_t end = text.find('\n', begin);
      if (end == kNone) end = text.size();
      const std::string_view line = text.substr(begin, end - begin);
      begin = end + 1;
      if (!raw_close.empty()) {
        if (line.find(raw_close) != kNone) raw_close.clear();
        emit(line);
        continue;
      }
      const Scan s = scan(line);
      if (!s.raw_open.empty()) raw_close = s.raw_open;
      if (line.size() <= limit_ || !s.raw_open.empty() || line.substr(indentation(line), 1) == "#") {
        emit(line);
      } else if (s.comment == indentation(line)) {
        comment(indentation(line), line.substr(s.comment + 2));
      } else if (s.comment != kNone) {
        // The comment goes above the code it was beside.
        comment(indentation(line), line.substr(s.comment + 2));
        const size_t code_end = line.find_last_not_of(' ', s.comment - 1) + 1;
        code(line.substr(0, code_end), indentation(line) + 4);
      } else {
        code(line, indentation(line) + 4);
      }
      if (end == text.size()) out_.pop_back();  // no newline at the end of the input
    }
    return out_;
  }

 private:
  void emit(std::string_view line) {
    out_ += line;
    out_ += '\n';
  }

  // Words are joined by one space, and a continuation line starts with
  // "//     ". A bracketed group ("split(0 by tp)") stays on one line when
  // it fits on one.
  void comment(size_t indent, std::string_view text) {
    const std::string next = std::string(indent, ' ') + "//    ";
    std::string current = std::string(indent, ' ') + "//";
    bool empty = true;
    const auto add = [&](std::string_view word) {
      if (!empty && current.size() + 1 + word.size() > limit_) {
        emit(current);
        current = next;
      }
      current += ' ';
      current += word;
      empty = false;
    };
    for (const std::string_view group : groups(text)) {
      if (next.size() + 1 + group.size() <= limit_) {
        add(group);
        continue;
      }
      for (size_t at = 0; at < group.size();) {  // too long for any line: word by word
        const size_t stop = std::min(group.find(' ', at), group.size());
        add(group.substr(at, stop - at));
        at = stop + 1;
      }
    }
    emit(current);
  }

  // The text split at spaces outside brackets.
  static std::vector<std::string_view> groups(std::string_view text) {
    std::vector<std::string_view> out;
    int depth = 0;
    size_t start = kNone;
    for (size_t i = 0; i <= text.size(); ++i) {
      const char c = i < text.size() ? text[i] : ' ';
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      if (c == ' ' && (depth == 0 || i == text.size())) {
        if (start != kNone) out.push_back(text.substr(start, i - start));
        start = kNone;
      } else if (start == kNone) {
        start = i;
      }
    }
    return out;
  }

  // `fallback`: the column to continue at when no bracket is open.
  void code(std::string_view line, size_t fallback) {
    if (line.size() <= limit_) {
      emit(line);
      return;
    }
    if (function_body(line)) return;
    const Scan s = scan(line);
    std::vector<size_t> open;                              // columns of the brackets open so far
    std::optional<std::pair<size_t, size_t>> after_comma;  // (break, continuation column)
    std::optional<size_t> after_bracket;
    std::optional<size_t> after_assign;  // "x = |value", outside brackets
    std::optional<size_t> at_space;      // before a name, outside brackets: "Type& |name("
    for (size_t i = 0; i < line.size() && i < limit_; ++i) {
      if (s.literal[i]) continue;
      const char c = line[i];
      if (c == ' ' && open.empty() && i > indentation(line) + 4 && i + 1 < line.size()) {
        if (line[i - 1] == '=' && line[i - 2] == ' ') after_assign = i;
        if (std::isalpha(static_cast<unsigned char>(line[i + 1])) || line[i + 1] == '_') at_space = i;
      }
      if (c == '(' || c == '{' || c == '[') {
        open.push_back(i);
        // Only a break that leaves the continuation shorter makes progress.
        const bool progress = i + 1 > indentation(line) + 4;
        if (progress && i + 1 < line.size() && line[i + 1] != ')' && line[i + 1] != '}') after_bracket = i + 1;
      } else if ((c == ')' || c == '}' || c == ']') && !open.empty()) {
        open.pop_back();
      } else if (c == ',' && i + 1 < line.size() && line[i + 1] == ' ') {
        const size_t column = open.empty() ? fallback : open.back() + 1;
        if (column + 20 < limit_) after_comma = std::make_pair(i + 1, column);
      }
    }
    // After '=' when the value then fits on one line, as clang-format
    // prefers; otherwise as far right as possible.
    if (after_assign && indentation(line) + 4 + line.size() - *after_assign - 1 <= limit_) {
      emit(line.substr(0, *after_assign));
      continue_at(indentation(line) + 4, line.substr(*after_assign + 1));
    } else if (after_comma) {
      emit(line.substr(0, after_comma->first));
      continue_at(after_comma->second, line.substr(after_comma->first));
    } else if (after_bracket) {
      emit(line.substr(0, *after_bracket));
      continue_at(indentation(line) + 4, line.substr(*after_bracket));
    } else if (at_space) {
      emit(line.substr(0, *at_space));
      continue_at(indentation(line) + 4, line.substr(*at_space + 1));
    } else {
      emit(line);  // nowhere to break it
    }
  }

  void continue_at(size_t column, std::string_view rest) {
    const size_t start = rest.find_first_not_of(' ');
    const std::string line = std::string(column, ' ') + std::string(rest.substr(start == kNone ? rest.size() : start));
    code(line, column);
  }

  // `head { body; }` -> head {, body; and } on lines of their own.
  bool function_body(std::string_view line) {
    if (line.size() < 4 || line.substr(line.size() - 2) != " }") return false;
    const Scan s = scan(line);
    int depth = 0;
    for (size_t i = 0; i + 2 < line.size(); ++i) {
      if (s.literal[i]) continue;
      if (line[i] == '(' || line[i] == '[') ++depth;
      if (line[i] == ')' || line[i] == ']') --depth;
      if (depth == 0 && line.substr(i, 3) == " { ") {
        const size_t indent = indentation(line);
        code(std::string(line.substr(0, i)) + " {", indent + 4);
        code(std::string(indent + 2, ' ') + std::string(line.substr(i + 3, line.size() - 2 - (i + 3))), indent + 6);
        emit(std::string(indent, ' ') + "}");
        return true;
      }
      if (line[i] == '{') return false;  // braces before the body: not a one-line function
    }
    return false;
  }

  size_t limit_;
  std::string out_;
};

}  // namespace

std::string wrap_lines(std::string_view text, size_t limit) { return Wrapper(limit).run(text); }

}  // namespace distckpt::gen
