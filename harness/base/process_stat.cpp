// This process's age (see process_stat.h).
#include "harness/base/process_stat.h"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mih {

std::optional<double> process_age_seconds() {
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (!f) return std::nullopt;
  char buf[1024] = {0};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p || static_cast<size_t>(p - buf) >= n) return std::nullopt;
  // After ") ": field 3 (state) ... field 22 (starttime, clock ticks after boot).
  const char* start_field = nullptr;
  int field = 2;
  for (const char* q = p + 1; *q && field < 22; ++q) {
    if (*q == ' ' && ++field == 22) start_field = q + 1;
  }
  if (!start_field) return std::nullopt;
  char* end = nullptr;
  const unsigned long long start = std::strtoull(start_field, &end, 10);
  if (end == start_field) return std::nullopt;
  timespec now{};
  if (::clock_gettime(CLOCK_BOOTTIME, &now) != 0) return std::nullopt;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double s = static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9 - static_cast<double>(start) / ticks;
  return s > 0 ? s : 0;
}

}  // namespace mih
