// Fault injection switch (see fault.h).
#include "harness/base/fault.h"

#include <cctype>
#include <cstdlib>

#include "harness/base/error.h"

namespace mih::fault {
namespace detail {

std::atomic<int> g_active{kUnread};
std::atomic<bool> g_reached{false};

namespace {

// -1 when `text` names no fault.
int id_of(std::string_view text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t.empty() || t == "none") return 0;
  if (t.size() < 2 || t.size() > 3 || t[0] != 'f') return -1;
  int n = 0;
  for (size_t i = 1; i < t.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) return -1;
    n = n * 10 + (t[i] - '0');
  }
  return catalogued(n) ? n : -1;
}

}  // namespace

int load_from_environment() noexcept {
  const char* env = std::getenv("MIH_FAULT");
  const int id = id_of(env ? env : "");
  const int value = id < 0 ? kUnknown : id;
  int expected = kUnread;
  // A ScopedFault set meanwhile wins.
  if (!g_active.compare_exchange_strong(expected, value, std::memory_order_relaxed)) return expected;
  return value;
}

}  // namespace detail

std::string name(Fault f) {
  const int n = static_cast<int>(f);
  if (!catalogued(n)) return "";
  return std::string(n < 10 ? "F0" : "F") + std::to_string(n);
}

std::vector<Fault> all() {
  std::vector<Fault> out;
  for (int n = 1; n <= kMaxFaultId; ++n) {
    if (catalogued(n)) out.push_back(static_cast<Fault>(n));
  }
  return out;
}

Fault parse(std::string_view text) {
  const int id = detail::id_of(text);
  MIH_CHECK(id >= 0, "unknown fault '", std::string(text), "': the catalog (docs/fault-catalog.md, `mih faults --list`) has ",
            kFaultCount, " faults, F01 to ", name(static_cast<Fault>(kMaxFaultId)));
  return static_cast<Fault>(id);
}

Fault current() {
  int a = detail::g_active.load(std::memory_order_relaxed);
  if (a == detail::kUnread) a = detail::load_from_environment();
  if (a == detail::kUnknown) {
    const char* env = std::getenv("MIH_FAULT");
    (void)parse(env ? env : "");  // throws, naming the value
  }
  return static_cast<Fault>(a);
}

void check_environment() { (void)current(); }

bool reached() noexcept { return detail::g_reached.load(std::memory_order_relaxed); }

ScopedFault::ScopedFault(Fault f) : previous_(detail::g_active.exchange(static_cast<int>(f))) {
  detail::g_reached.store(false, std::memory_order_relaxed);
}
ScopedFault::~ScopedFault() { detail::g_active.store(previous_); }

}  // namespace mih::fault
