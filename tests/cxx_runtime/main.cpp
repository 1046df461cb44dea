// Removes a directory tree with std::filesystem::remove_all and says whose
// copy of the function ran: libstdc++'s (exit 0) or the library's (exit 3).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "file") << "x";
  std::error_code error;
  const auto removed = std::filesystem::remove_all(dir, error);
  if (removed == 4242) {
    std::puts("remove_all: the library's copy");
    return 3;
  }
  std::printf("remove_all: libstdc++'s, %ju removed, %s\n", static_cast<std::uintmax_t>(removed),
              std::filesystem::exists(dir) ? "the directory is still there" : "the directory is gone");
  return removed == 3 && !std::filesystem::exists(dir) ? 0 : 1;
}
