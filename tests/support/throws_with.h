// Test support: assert the exact exception type and a part of its message.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <typeinfo>

// Passes when `f()` throws exactly E (not a subclass of E, so tests pin the
// error kind callers dispatch on) and the message contains `part`.
//   EXPECT_TRUE(throws_with<distckpt::CorruptionError>([&] { ... }, "chunk 3"));
template <typename E, typename F>
testing::AssertionResult throws_with(F&& f, const std::string& part) {
  try {
    f();
  } catch (const std::exception& e) {
    if (typeid(e) != typeid(E)) {
      return testing::AssertionFailure() << "threw " << typeid(e).name() << " instead of " << typeid(E).name() << ": "
                                         << e.what();
    }
    if (std::string(e.what()).find(part) == std::string::npos) {
      return testing::AssertionFailure() << "message \"" << e.what() << "\" lacks \"" << part << "\"";
    }
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure() << "nothing was thrown (expected " << typeid(E).name() << ")";
}
