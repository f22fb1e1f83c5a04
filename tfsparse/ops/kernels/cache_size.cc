#include "cache_size.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace tfsparse {
namespace {

// sysfs: "/sys/devices/system/cpu/cpu0/cache/index<i>/" of level 2 and type
// Data or Unified, its size as "1024K" or "2M"; 0 when absent.
int64_t L2BytesFromSysfs() {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" +
                            std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"),
        size_file(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) ||
        !(size_file >> size)) {
      continue;
    }
    if (level != 2 || (type != "Data" && type != "Unified") || size.empty()) {
      continue;
    }
    int64_t scale = 1;
    if (size.back() == 'K') scale = int64_t{1} << 10;
    if (size.back() == 'M') scale = int64_t{1} << 20;
    return std::strtoll(size.c_str(), nullptr, 10) * scale;
  }
  return 0;
}

}  // namespace

int64_t L2CacheBytes() {
  static const int64_t bytes = [] {
#ifdef _SC_LEVEL2_CACHE_SIZE
    const long reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (reported > 0) return int64_t{reported};
#endif
    const int64_t from_sysfs = L2BytesFromSysfs();
    return from_sysfs > 0 ? from_sysfs : kAssumedL2Bytes;
  }();
  return bytes;
}

}  // namespace tfsparse
