// Stands in for a wheel's libtorch.so: it exports its own copy of a libstdc++
// function (here one that removes nothing and says so), as those do.
#include <cstdint>
#include <filesystem>
#include <system_error>

namespace std::filesystem {
std::uintmax_t remove_all(const path&, std::error_code& error) {
  error.clear();
  return 4242;
}
}  // namespace std::filesystem
