// Fits generated C++ into the project's column limit (.clang-format: 120),
// after the emitters wrote it with no regard for line length:
//  - a long comment is re-flowed at word boundaries; its continuation lines
//    are indented 4 more after the '//', as a schema continues a declaration;
//  - a trailing comment that does not fit moves above its code;
//  - a one-line function body that does not fit gets lines of its own;
//  - other code is broken after '=' when the value then fits on one line;
//    else after a comma, continuing right after the innermost open bracket
//    (clang-format's Google style); else after an opening bracket, or
//    before a name outside brackets (after a return type), continuing with
//    an indent of 4.
// Nothing is broken inside a literal; preprocessor lines and raw string
// literals (the embedded schema) stay as they are, and so does a line that
// cannot be broken short enough (a string literal or name longer than the
// room left).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace distckpt::gen {

constexpr size_t kColumnLimit = 120;

std::string wrap_lines(std::string_view text, size_t limit = kColumnLimit);

}  // namespace distckpt::gen
