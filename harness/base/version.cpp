// harness_version() from the build, build_id() from the executable's NT_GNU_BUILD_ID note.
#include "harness/base/version.h"

#include <elf.h>
#include <link.h>

#include <cstdio>
#include <cstring>

#ifndef MIH_VERSION
#error "MIH_VERSION must be defined by the build (CMake's PROJECT_VERSION)"
#endif

namespace mih {
namespace {

// The first object dl_iterate_phdr reports is the executable itself.
int find_build_id(dl_phdr_info* info, size_t, void* out) {
  auto* hex = static_cast<std::string*>(out);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0 &&
          desc + note->n_descsz <= end) {
        char byte[3];
        for (unsigned k = 0; k < note->n_descsz; ++k) {
          std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(desc[k]));
          *hex += byte;
        }
        return 1;
      }
      p = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return 1;  // only the executable
}

}  // namespace

std::string_view harness_version() { return MIH_VERSION; }

const std::string& build_id() {
  static const std::string id = [] {
    std::string hex;
    dl_iterate_phdr(find_build_id, &hex);
    return hex;
  }();
  return id;
}

}  // namespace mih
