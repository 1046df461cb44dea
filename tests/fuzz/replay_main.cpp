// Replays fuzz inputs without libFuzzer (the gcc build and CI): runs
// LLVMFuzzerTestOneInput once per file of each folder or file named on the
// command line. A crash or an uncaught exception fails the run; so does an
// empty corpus, which would otherwise pass while testing nothing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::filesystem::path> inputs_of(const std::filesystem::path& arg) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::is_directory(arg)) {
    for (const auto& e : std::filesystem::directory_iterator(arg)) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
  } else {
    out.push_back(arg);
  }
  std::sort(out.begin(), out.end());  // a failure names the same file every run
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& path : inputs_of(argv[i])) {
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "cannot read %s\n", path.c_str());
        return 1;
      }
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // Named first, so the log says which input crashed.
      std::fprintf(stderr, "%s\n", path.c_str());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  std::printf("replayed %zu inputs, none crashed\n", replayed);
  return replayed > 0 ? 0 : 1;
}
