// The zip index torch.save files are read through (format/zip_archive.h):
// archives built here field by field, plain and zip64, and each way one can
// lie about where its bytes are; CRC-32 against the standard check value.
#include "format/zip_archive.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

void put(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

struct Spec {
  std::string name;
  std::string data;
  uint16_t method = 0;
  uint16_t flags = 0;
  std::string local_name{};   // empty: the same as `name`
  std::string local_extra{};  // torch.save's alignment padding lives here
  int64_t header_at = -1;     // >= 0: where the directory says the local header is
};

// A stored archive of `specs`; zip64 escapes every size and offset (and the
// entry count) into the zip64 records.
std::string archive(const std::vector<Spec>& specs, bool zip64 = false, const std::string& comment = "") {
  std::string out, directory;
  std::vector<uint64_t> offsets;
  for (const Spec& s : specs) {
    const std::string& local_name = s.local_name.empty() ? s.name : s.local_name;
    zip::Crc32 crc;
    crc.update(s.data.data(), s.data.size());
    offsets.push_back(out.size());
    put(out, 0x04034b50, 4);
    put(out, 20, 2);
    put(out, s.flags, 2);
    put(out, s.method, 2);
    put(out, 0, 4);
    put(out, crc.value(), 4);
    put(out, s.data.size(), 4);
    put(out, s.data.size(), 4);
    put(out, local_name.size(), 2);
    put(out, s.local_extra.size(), 2);
    out += local_name + s.local_extra + s.data;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    zip::Crc32 crc;
    crc.update(s.data.data(), s.data.size());
    const uint64_t offset = s.header_at >= 0 ? static_cast<uint64_t>(s.header_at) : offsets[i];
    std::string extra;
    if (zip64) {
      put(extra, 0x0001, 2);
      put(extra, 24, 2);
      put(extra, s.data.size(), 8);
      put(extra, s.data.size(), 8);
      put(extra, offset, 8);
    }
    put(directory, 0x02014b50, 4);
    put(directory, 45, 2);
    put(directory, 45, 2);
    put(directory, s.flags, 2);
    put(directory, s.method, 2);
    put(directory, 0, 4);
    put(directory, crc.value(), 4);
    put(directory, zip64 ? 0xFFFFFFFF : s.data.size(), 4);
    put(directory, zip64 ? 0xFFFFFFFF : s.data.size(), 4);
    put(directory, s.name.size(), 2);
    put(directory, extra.size(), 2);
    put(directory, 0, 2);
    put(directory, 0, 2);
    put(directory, 0, 2);
    put(directory, 0, 4);
    put(directory, zip64 ? 0xFFFFFFFF : offset, 4);
    directory += s.name + extra;
  }
  const uint64_t directory_at = out.size();
  out += directory;
  if (zip64) {
    const uint64_t end64_at = out.size();
    put(out, 0x06064b50, 4);
    put(out, 44, 8);
    put(out, 45, 2);
    put(out, 45, 2);
    put(out, 0, 4);
    put(out, 0, 4);
    put(out, specs.size(), 8);
    put(out, specs.size(), 8);
    put(out, directory.size(), 8);
    put(out, directory_at, 8);
    put(out, 0x07064b50, 4);
    put(out, 0, 4);
    put(out, end64_at, 8);
    put(out, 1, 4);
  }
  put(out, 0x06054b50, 4);
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, zip64 ? 0xFFFF : specs.size(), 2);
  put(out, zip64 ? 0xFFFF : specs.size(), 2);
  put(out, zip64 ? 0xFFFFFFFF : directory.size(), 4);
  put(out, zip64 ? 0xFFFFFFFF : directory_at, 4);
  put(out, comment.size(), 2);
  return out + comment;
}

zip::Index index_of(const std::string& bytes) {
  return zip::Index(
      [&](void* data, size_t n, uint64_t offset) {
        if (offset > bytes.size() || bytes.size() - offset < n) throw CorruptionError("read past the end");
        std::memcpy(data, bytes.data() + offset, n);
      },
      bytes.size(), "'t.pt' cannot be read");
}

// Whether indexing `bytes` throws a CorruptionError saying `part`.
testing::AssertionResult refused(const std::string& bytes, const std::string& part) {
  return throws_with<CorruptionError>([&] { index_of(bytes); }, part);
}

std::string data_of(const std::string& bytes, const zip::Entry& e) { return bytes.substr(e.data_offset, e.size); }

const std::vector<Spec> kTwo = {{"a/data.pkl", "pickle bytes"}, {"a/data/0", std::string(100, 'x'), 0, 0, "", "FB"}};

TEST(ZipCrc32, MatchesTheCheckValueWholeOrInPieces) {
  zip::Crc32 empty;
  EXPECT_EQ(empty.value(), 0u);
  const std::string check = "123456789";
  zip::Crc32 whole;
  whole.update(check.data(), check.size());
  EXPECT_EQ(whole.value(), 0xCBF43926u);  // CRC-32/ISO-HDLC's check value
  const std::string long_text(1000, 'q');
  zip::Crc32 one, pieces;
  one.update(long_text.data(), long_text.size());
  for (size_t at = 0; at < long_text.size(); at += 7) pieces.update(&long_text[at], std::min<size_t>(7, 1000 - at));
  EXPECT_EQ(one.value(), pieces.value());
}

// Long inputs fold 64 bytes at a time with carry-less multiplication (where
// the CPU has it); pieces shorter than 64 bytes take the tables: both agree,
// at every length and alignment.
TEST(ZipCrc32, FoldingAndTablesAgreeAtEveryLengthAndAlignment) {
  std::string bytes(1 << 20, '\0');
  uint32_t x = 12345;
  for (char& c : bytes) c = static_cast<char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t n : {size_t{0}, size_t{15}, size_t{63}, size_t{64}, size_t{65}, size_t{127}, size_t{128}, size_t{200},
                     size_t{1000}, size_t{4097}, bytes.size() - 16}) {
      zip::Crc32 whole, pieces;
      whole.update(bytes.data() + offset, n);
      for (size_t at = 0; at < n; at += 63) pieces.update(bytes.data() + offset + at, std::min<size_t>(63, n - at));
      ASSERT_EQ(whole.value(), pieces.value()) << "offset " << offset << ", " << n << " bytes";
    }
  }
}

TEST(ZipIndex, FindsEveryEntryPlainOrZip64BehindAComment) {
  for (const bool zip64 : {false, true}) {
    for (const std::string comment : {"", "a comment with PK\x05\x06 inside"}) {
      const std::string bytes = archive(kTwo, zip64, comment);
      const zip::Index index = index_of(bytes);
      ASSERT_EQ(index.entries().size(), 2u);
      const zip::Entry* pkl = index.find("a/data.pkl");
      const zip::Entry* storage = index.find("a/data/0");
      ASSERT_TRUE(pkl && storage);
      EXPECT_EQ(data_of(bytes, *pkl), "pickle bytes");
      EXPECT_EQ(data_of(bytes, *storage), std::string(100, 'x'));  // past the local extra field
      zip::Crc32 crc;
      crc.update(bytes.data() + storage->data_offset, storage->size);
      EXPECT_EQ(crc.value(), storage->crc32);
      EXPECT_EQ(index.find("a/data/1"), nullptr);
    }
  }
}

TEST(ZipIndex, EmptyArchiveHasNoEntries) { EXPECT_TRUE(index_of(archive({})).entries().empty()); }

TEST(ZipIndex, TruncatedOrForeignBytesAreRefused) {
  const std::string bytes = archive(kTwo);
  EXPECT_TRUE(refused(bytes.substr(0, 10), "'t.pt' cannot be read: 10 bytes are too few"));
  EXPECT_TRUE(refused(bytes.substr(0, bytes.size() - 1), "no end of central directory"));
  EXPECT_TRUE(refused(bytes.substr(20), "passes its end record"));
  EXPECT_TRUE(refused(std::string(200, '\0'), "no end of central directory"));
}

TEST(ZipIndex, EntryCountsAndOffsetsThatLieAreRefused) {
  std::string more = archive(kTwo);
  more[more.size() - 12] = 9;  // entries in total: 9
  more[more.size() - 14] = 9;  // on this disk
  EXPECT_TRUE(refused(more, "9 entries cannot fit a central directory of"));
  std::string disks = archive(kTwo);
  disks[disks.size() - 18] = 1;
  EXPECT_TRUE(refused(disks, "spans several disks"));
  std::string past = archive(kTwo);
  past[past.size() - 6] = static_cast<char>(0xF0);  // the directory's offset, low byte
  EXPECT_TRUE(refused(past, "passes its end record"));
}

// A sparse file may claim a central directory of gigabytes in a few KB on
// disk: it is refused before anything is read into memory.
TEST(ZipIndex, AHugeCentralDirectoryIsRefusedBeforeItIsRead) {
  const uint64_t size = uint64_t{3} << 30, directory = size - 22;
  std::string end;
  put(end, 0x06054b50, 4);
  put(end, 0, 2);
  put(end, 0, 2);
  put(end, 1, 2);
  put(end, 1, 2);
  put(end, directory, 4);
  put(end, 0, 4);
  put(end, 0, 2);
  uint64_t largest_read = 0;
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] {
        zip::Index(
            [&](void* data, size_t n, uint64_t offset) {
              largest_read = std::max<uint64_t>(largest_read, n);
              std::memset(data, 0, n);
              for (size_t i = 0; i < n; ++i) {
                if (offset + i >= size - end.size())
                  static_cast<char*>(data)[i] = end[offset + i - (size - end.size())];
              }
            },
            size, "'t.pt' cannot be read");
      },
      "a central directory of 3221225450 bytes, more than the 536870912 distckpt reads"));
  EXPECT_LT(largest_read, uint64_t{1} << 20);
}

TEST(ZipIndex, EntriesThatCannotBeReadDirectlyAreRefused) {
  std::vector<Spec> specs = kTwo;
  specs[1].method = 8;
  EXPECT_TRUE(refused(archive(specs), "entry 'a/data/0' is compressed (method 8)"));
  specs = kTwo;
  specs[0].flags = 1;
  EXPECT_TRUE(refused(archive(specs), "entry 'a/data.pkl' is encrypted"));
  specs = kTwo;
  specs[1].local_name = "a/data/9";
  EXPECT_TRUE(refused(archive(specs), "entry 'a/data/0''s local header names 'a/data/9'"));
  specs = kTwo;
  specs[1].name = "a/data.pkl";
  specs[1].local_name = "a/data.pkl";
  EXPECT_TRUE(refused(archive(specs), "entry 'a/data.pkl' appears twice"));
}

// An entry hidden inside another's data (the zip-bomb construction) would
// make the same bytes count twice.
TEST(ZipIndex, OverlappingEntriesAreRefused) {
  const std::string inner_data(16, 'z');
  zip::Crc32 crc;
  crc.update(inner_data.data(), inner_data.size());
  std::string inner;  // a whole local entry "a/data/1"
  for (const auto& [v, n] : std::vector<std::pair<uint64_t, int>>{
           {0x04034b50, 4}, {20, 2}, {0, 2}, {0, 2}, {0, 4}, {crc.value(), 4}, {16, 4}, {16, 4}, {8, 2}, {0, 2}}) {
    put(inner, v, n);
  }
  inner += "a/data/1" + inner_data;
  std::vector<Spec> specs = {{"a/data/0", inner}, {"a/data/1", inner_data}};
  specs[1].header_at = 30 + 8;  // inside a/data/0's data
  EXPECT_TRUE(refused(archive(specs), "two entries overlap at byte 38"));
}

// An entry whose data runs into the directory.
TEST(ZipIndex, DataPastTheDirectoryIsRefused) {
  std::string bytes = archive(kTwo);
  const size_t second = bytes.find("PK\x01\x02", bytes.find("PK\x01\x02") + 4);
  for (const size_t field : {20, 24}) {  // stored size and size: 65535
    bytes[second + field] = static_cast<char>(0xFF);
    bytes[second + field + 1] = static_cast<char>(0xFF);
  }
  EXPECT_TRUE(refused(bytes, "entry 'a/data/0' (65535 bytes at"));
}

}  // namespace
}  // namespace distckpt
