// Error recovery for the schema grammar: one run reports every syntax error
// of a file. A statement that fails to parse is reported, dropped, and
// skipped up to its end (the next ';' or its closing '}' at the same brace
// depth), then parsing resumes with the next statement.
#pragma once

#include <cstddef>
#include <tao/pegtl.hpp>

namespace distckpt::gen::grammar {

// Where a statement sits: inside a block, a '}' at depth 0 closes the block
// and must be left for it; at the top level a stray '}' is skipped too.
enum class Level { kBlock, kTop };

// Skips from `pos` to just after the end of the broken statement and the
// whitespace and comments after it. Returns the number of bytes skipped.
inline std::size_t statement_tail_length(const char* pos, const char* end, Level level) {
  const char* p = pos;
  int depth = 0;
  bool done = false;
  while (p != end && !done) {
    const char c = *p;
    if (c == '#') {
      while (p != end && *p != '\n') ++p;
      continue;
    }
    if (c == ';' && depth == 0) {
      done = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (depth == 0 && level == Level::kBlock) break;  // the enclosing block's '}'
      // A '}' that closes the block the statement opened ends the statement.
      done = depth <= 1;
      if (depth > 0) --depth;
    }
    ++p;
  }
  // Leave the input on the next token, as every token rule does.
  while (p != end) {
    if (*p == '#') {
      while (p != end && *p != '\n') ++p;
    } else if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v') {
      ++p;
    } else {
      break;
    }
  }
  return static_cast<std::size_t>(p - pos);
}

// Matches Rule (a must<> of one statement). On a syntax error inside it the
// parser state reports the error and forgets the half-built statement, and
// the input moves past the statement, so the enclosing loop goes on. When the
// error stands on a word that starts a statement (Resume; typically a missing
// ';' or '}' before it), parsing resumes right there instead, so that next
// statement is not lost. State must provide `mark()` and `abandon(mark, error)`.
template <typename Rule, typename Resume, Level kLevel = Level::kBlock>
struct recover {
  using rule_t = recover;
  using subs_t = tao::pegtl::type_list<Rule>;

  template <tao::pegtl::apply_mode A, tao::pegtl::rewind_mode M, template <typename...> class Action,
            template <typename...> class Control, typename ParseInput, typename State>
  [[nodiscard]] static bool match(ParseInput& in, State& state) {
    namespace pegtl = tao::pegtl;
    const auto mark = state.mark();
    const std::size_t start = in.byte();
    try {
      return Control<Rule>::template match<A, M, Action, Control>(in, state);
    } catch (const pegtl::parse_error& error) {
      state.abandon(mark, error);
      // Unwinding rewound the input to some rule's start; continue from the
      // error itself so the statement's own tokens are not read twice.
      const std::size_t error_byte = error.positions().front().byte;
      if (error_byte > in.byte()) in.bump(error_byte - in.byte());
      const bool resume_here =
          in.byte() > start && pegtl::match<pegtl::at<Resume>, pegtl::apply_mode::nothing, pegtl::rewind_mode::required,
                                            pegtl::nothing, pegtl::normal>(in);
      if (!resume_here) in.bump(statement_tail_length(in.current(), in.end(), kLevel));
      // Never loop in place: a statement always consumes something.
      if (in.byte() == start && !in.empty()) in.bump(1);
      return true;
    }
  }
};

}  // namespace distckpt::gen::grammar
