// Reading what another rank sent (schema/wire.fbs). Peer bytes are untrusted:
// every buffer is verified before it is read, and any message that does not
// verify or make sense raises ProtocolError naming the message and the rank.
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt::plan {

// `what` from `origin` ("save plan", "rank 3") is malformed because `why`.
[[noreturn]] inline void malformed(std::string_view what, std::string_view origin, std::string_view why) {
  throw ProtocolError(
      fmt::format("{} from {} is malformed ({}): a bug, or ranks running different versions of "
                  "distckpt",
                  what, origin, why));
}

// The verified root table T of `bytes`, or ProtocolError. `identifier`: the
// file identifier the buffer must carry (nullptr: none).
template <typename T>
const T& verified_message(std::string_view bytes, std::string_view what, std::string_view origin,
                          const char* identifier = nullptr) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  flatbuffers::Verifier verifier(data, bytes.size(), 64, 1u << 30);
  if (!verifier.VerifyBuffer<T>(identifier)) malformed(what, origin, "failed FlatBuffers verification");
  return *flatbuffers::GetRoot<T>(data);
}

// An optional string field ("" when absent).
inline std::string string_or_empty(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

// An optional vector of strings (empty when absent).
inline std::vector<std::string> strings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v) {
  std::vector<std::string> out;
  if (!v) return out;
  out.reserve(v->size());
  for (const flatbuffers::String* s : *v) out.push_back(s->str());
  return out;
}

// An optional vector of scalars (empty when absent). The verifier checks only
// the alignment of a vector's length prefix: 8-byte elements of a crafted
// buffer can sit at 4 mod 8, and reading them would be undefined behaviour.
template <typename T>
std::vector<T> scalars(const flatbuffers::Vector<T>* v, std::string_view what, std::string_view origin) {
  if (!v || v->size() == 0) return {};
  if (reinterpret_cast<uintptr_t>(v->data()) % alignof(T) != 0) {
    malformed(what, origin, fmt::format("a vector of {}-byte values is misaligned", sizeof(T)));
  }
  return std::vector<T>(v->begin(), v->end());
}

// A finished builder's bytes.
inline std::string message_bytes(const flatbuffers::FlatBufferBuilder& b) {
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

}  // namespace distckpt::plan
