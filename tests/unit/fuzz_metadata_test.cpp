// A deterministic mini-fuzzer for the two decoders that read untrusted bytes
// (metadata.fb and the common state): mutate valid buffers and require that
// decoding either succeeds or throws distckpt::Error, never crashes, hangs or
// throws anything else. Meant to run under AddressSanitizer too.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "distckpt/core/errors.h"
#include "format/common_state.h"
#include "format/metadata.h"

namespace distckpt {
namespace {

constexpr int kIterations = 2000;
constexpr uint64_t kSeed = 0x5eed'd15c'c4e7ull;

CheckpointMetadata fuzz_seed_metadata() {
  CheckpointMetadata m;
  m.world_size = 2;
  m.checksum_block_size = 16;
  m.files = {{"data/rank_0.bin", 1024, 0}, {"data/rank_1.bin", 1024, 1}};
  m.tensors = {
      {"a.weight",
       at::kFloat,
       {4, 4},
       {{{{0, 0}, {2, 4}}, std::nullopt, 0, 0, 32, {1, 2}}, {{{2, 0}, {2, 4}}, FlatRange{1, 5}, 1, 64, 16, {3}}}},
      {"b.bias", at::kBFloat16, {6}, {{{{0}, {6}}, std::nullopt, 1, 200, 12, {4}}}},
      {"c.step", at::kLong, {}, {{{{}, {}}, std::nullopt, 0, 512, 8, {5}}}},
  };
  m.objects = {{"rng", {2}, {0}, 0, 600, 20, {6, 7}}, {"rng", {2}, {1}, 1, 600, 20, {8, 9}}};
  m.common_file = "common.fb";
  m.layout_name = "gpt";
  m.layout_schema = "layout gpt;";
  return m;
}

Value fuzz_seed_common_state() {
  Value root = Value::dict();
  root["iteration"] = 12;
  root["lr"] = 0.5;
  root["name"] = "run";
  root["flags"] = List{true, Value(), "x", List{1, 2}};
  root["rng"]["state"] = at::arange(8, at::kByte);
  root["rng"]["scalar"] = at::scalar_tensor(3.5, at::kDouble);
  return root;
}

// One random edit of `bytes`: the kinds of damage real files suffer (bit
// flips, truncation) plus edits that target FlatBuffers offsets (small
// 32-bit values, spliced copies of other parts of the buffer).
std::string mutate(const std::string& bytes, std::mt19937_64& rng) {
  std::string out = bytes;
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  switch (rng() % 5) {
    case 0:  // flip a few random bits
      for (size_t i = 0, n = 1 + pick(8); i < n && !out.empty(); ++i) out[pick(out.size())] ^= char(1 << pick(8));
      break;
    case 1:  // truncate
      out.resize(pick(out.size()));
      break;
    case 2: {  // overwrite an aligned word with a small or extreme value
      if (out.size() < 4) break;
      const size_t at = pick(out.size() / 4) * 4;
      const uint32_t values[] = {0, 1, 4, 0x7fffffff, 0xffffffff, static_cast<uint32_t>(pick(out.size()))};
      const uint32_t v = values[pick(6)];
      for (int b = 0; b < 4; ++b) out[at + b] = static_cast<char>(v >> (8 * b));
      break;
    }
    case 3: {  // splice: copy one slice of the buffer over another
      const size_t from = pick(out.size()), to = pick(out.size());
      const size_t len = std::min({1 + pick(32), out.size() - from, out.size() - to});
      std::copy_n(bytes.begin() + from, len, out.begin() + to);
      break;
    }
    default: {  // insert random bytes (shifts every later offset)
      std::string noise(1 + pick(8), '\0');
      for (auto& c : noise) c = static_cast<char>(rng());
      out.insert(pick(out.size() + 1), noise);
      break;
    }
  }
  return out;
}

struct Outcome {
  int decoded = 0;
  int rejected = 0;
};

// Runs the fuzzer; `decode` must throw only distckpt::Error.
Outcome fuzz(const std::string& seed, const std::function<void(const std::string&)>& decode) {
  std::mt19937_64 rng(kSeed);
  Outcome outcome;
  for (int i = 0; i < kIterations; ++i) {
    std::string input = mutate(seed, rng);
    if (rng() % 4 == 0) input = mutate(input, rng);  // sometimes two edits
    try {
      decode(input);
      ++outcome.decoded;
    } catch (const Error&) {
      ++outcome.rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << i << " threw a non-distckpt exception: " << e.what();
    }
  }
  return outcome;
}

TEST(FuzzMetadataTest, MutatedMetadataDecodesOrThrowsError) {
  const std::string seed = encode_metadata(fuzz_seed_metadata());
  const Outcome outcome = fuzz(seed, [](const std::string& bytes) {
    const CheckpointMetadata m = decode_metadata(bytes, "fuzz.fb");
    // Whatever decodes is self-consistent: it re-encodes and decodes again.
    const CheckpointMetadata again = decode_metadata(encode_metadata(m), "fuzz.fb");
    EXPECT_EQ(again.tensors.size(), m.tensors.size());
    EXPECT_EQ(again.files.size(), m.files.size());
  });
  EXPECT_EQ(outcome.decoded + outcome.rejected, kIterations);
  EXPECT_GT(outcome.rejected, kIterations / 4);  // the mutations do reach the checks
  EXPECT_GT(outcome.decoded, 0);                 // and some edits are harmless
}

// Records decoded one at a time: a mutated buffer opens and decodes each
// record or throws distckpt::Error, and where decode_metadata accepts it,
// every record decodes the same.
TEST(FuzzMetadataTest, MutatedMetadataDecodesLazilyOrThrowsError) {
  const std::string seed = encode_metadata(fuzz_seed_metadata());
  const Outcome outcome = fuzz(seed, [](const std::string& bytes) {
    std::optional<CheckpointMetadata> whole;
    try {
      whole = decode_metadata(bytes, "fuzz.fb");
    } catch (const Error&) {
    }
    try {
      LazyMetadata lazy(bytes, "fuzz.fb");
      for (size_t i = 0; i < lazy.tensor_count(); ++i) {
        const std::string key(lazy.key_at(i));
        const TensorRecord record = lazy.tensor(i);
        EXPECT_EQ(record.key, key);
        EXPECT_EQ(lazy.find(key), i);
        if (whole) {
          EXPECT_EQ(record.global_shape, whole->tensors[i].global_shape);
          EXPECT_EQ(record.chunks.size(), whole->tensors[i].chunks.size());
        }
      }
    } catch (const Error&) {
      EXPECT_FALSE(whole.has_value()) << "decode_metadata accepts what LazyMetadata refuses";
      throw;
    }
  });
  EXPECT_EQ(outcome.decoded + outcome.rejected, kIterations);
  EXPECT_GT(outcome.rejected, kIterations / 4);
  EXPECT_GT(outcome.decoded, 0);
}

// A format 3 file opened from its head, records read alone: a mutated file
// opens and reads each record or throws distckpt::Error; where
// decode_metadata accepts it (and so says where its head ends), every record
// reads the same.
TEST(FuzzMetadataTest, MutatedMetadataReadByPartsDecodesOrThrowsError) {
  const std::string seed = encode_metadata(fuzz_seed_metadata());
  const uint64_t seed_head = metadata_head_bytes(seed);
  const Outcome outcome = fuzz(seed, [&](const std::string& bytes) {
    std::optional<CheckpointMetadata> whole;
    try {
      whole = decode_metadata(bytes, "fuzz.fb");
    } catch (const Error&) {
    }
    if (whole && whole->format_version < 3) return;  // an edited version: no index to read by
    const uint64_t head = whole ? metadata_head_bytes(bytes) : std::min<uint64_t>(seed_head, bytes.size());
    try {
      LazyMetadata lazy(
          bytes.substr(0, head), bytes.size(),
          [&](uint64_t offset, uint64_t length, uint8_t* out) {
            ASSERT_LE(offset + length, bytes.size());
            std::memcpy(out, bytes.data() + offset, length);
          },
          "fuzz.fb");
      for (size_t i = 0; i < lazy.tensor_count(); ++i) {
        const TensorRecord record = lazy.tensor(i);
        EXPECT_EQ(record.key, lazy.key_at(i));
        if (whole) {
          EXPECT_EQ(record.key, whole->tensors[i].key);
          EXPECT_EQ(record.chunks.size(), whole->tensors[i].chunks.size());
          for (const ChunkRecord& c : record.chunks) EXPECT_EQ(lazy.file(c.file).path, whole->files[c.file].path);
        }
      }
      if (whole) EXPECT_EQ(lazy.files().size(), whole->files.size());
    } catch (const Error& e) {
      EXPECT_FALSE(whole.has_value()) << "decode_metadata accepts what a reader by parts refuses: " << e.what();
      throw;
    }
  });
  EXPECT_EQ(outcome.decoded + outcome.rejected, kIterations);
  EXPECT_GT(outcome.rejected, kIterations / 4);
  EXPECT_GT(outcome.decoded, 0);
}

TEST(FuzzMetadataTest, MutatedCommonStateDecodesOrThrowsError) {
  const std::string seed = encode_common_state(fuzz_seed_common_state());
  const Outcome outcome = fuzz(seed, [](const std::string& bytes) {
    // Compared as bytes: a flipped bit may have made a float NaN.
    const std::string encoded = encode_common_state(decode_common_state(bytes, "fuzz.common"));
    EXPECT_EQ(encode_common_state(decode_common_state(encoded, "fuzz.common")), encoded);
  });
  EXPECT_EQ(outcome.decoded + outcome.rejected, kIterations);
  EXPECT_GT(outcome.rejected, kIterations / 4);
  EXPECT_GT(outcome.decoded, 0);
}

}  // namespace
}  // namespace distckpt
