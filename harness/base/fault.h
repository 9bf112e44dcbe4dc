// Fault injection for the fault catalog (docs/fault-catalog.md, `mih faults`): each catalogued
// integration bug is written into the reference models, the data pipeline or the runtime at
// the place where it happened in the public stacks, behind a fault point
//
//   if (fault::active(fault::Fault::kF03)) { ...the buggy code... } else { ...the correct code... }
//
// that is inert unless the process's MIH_FAULT environment variable names it (MIH_FAULT=F03).
// The conformance runner sets MIH_FAULT only in the rank processes of the cases it is asked
// to break (`mih test --fault F03 --fault-cases DpShard2`); the reference and every other
// case run the correct code. When off, a fault point costs one relaxed atomic load and a
// compare (bench/fault_switch.cpp measures it). A fault point that fires records it
// (reached()): a case whose ranks never reached their fault's point ran the correct code
// throughout and checked nothing about the fault, which the runner reports as bad input
// (exit 11), never as a pass. Write a fault point's condition so that active() is evaluated
// only where the faulty code then runs. No torch here.
#pragma once

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

namespace mih::fault {

/// The catalogued faults (docs/fault-catalog.md), by ID. kNone: no fault (MIH_FAULT unset or empty).
enum class Fault : int {
  kNone = 0,
  kF01, kF02, kF03, kF04, kF05, kF06, kF07, kF08, kF09, kF10, kF11,
  kF12, kF13, kF14, kF15, kF16, kF17, kF18, kF19, kF20, kF21, kF22,
  kF23, kF24, kF25,  // expert parallelism
  kF26,
  kF27,  // the data pipeline shared by the reference and every case
  kF28, kF29, kF30, kF31, kF32,  // the original model (config-invariant; only MatchesOriginal sees them)
  kF33, kF34, kF35,  // pipeline parallelism
  kF36,  // KV heads replicated over tp (tp > num_key_value_heads)
  kF37, kF38, kF39,  // packed documents and attention windows under cp and sp
  kF40, kF41,        // optimizers beyond AdamW, learning-rate schedules across resumes
  kF42,              // the moe's load-balancing loss under pipeline parallelism
  kF43, kF44,        // a data loader's state across resumes
};
/// The catalogued IDs, ascending: the faults `mih faults` runs and MIH_FAULT accepts. An
/// enumerator joins this list in the change that adds its row to harness/cases/fault_catalog.cpp.
inline constexpr int kCatalogued[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18,
                                      19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44};
/// How many faults are catalogued, and the largest ID.
inline constexpr int kFaultCount = static_cast<int>(sizeof(kCatalogued) / sizeof(kCatalogued[0]));
inline constexpr int kMaxFaultId = kCatalogued[kFaultCount - 1];
/// True for the ID of a catalogued fault (one of kCatalogued).
constexpr bool catalogued(int id) noexcept {
  for (int c : kCatalogued) {
    if (c == id) return true;
  }
  return false;
}

namespace detail {
/// The fault of this process: -1 until MIH_FAULT is read, then a Fault, or kUnknown when
/// MIH_FAULT names no fault (check_environment() throws on it).
inline constexpr int kUnread = -1, kUnknown = 1000;
extern std::atomic<int> g_active;
extern std::atomic<bool> g_reached;
int load_from_environment() noexcept;
}  // namespace detail

/// True when this process injects `f` (and then reached() is true). MIH_FAULT is read on the
/// first call (thread-safe).
inline bool active(Fault f) noexcept {
  int a = detail::g_active.load(std::memory_order_relaxed);
  if (a == detail::kUnread) [[unlikely]] a = detail::load_from_environment();
  if (a != static_cast<int>(f)) return false;
  detail::g_reached.store(true, std::memory_order_relaxed);
  return true;
}

/// Whether a fault point of this process's fault fired (active() returned true) since the
/// process started or the last ScopedFault was made: the faulty code ran. False without a fault.
bool reached() noexcept;

/// The fault of this process (kNone when MIH_FAULT is unset or empty).
/// Throws: mih::Error{kInvalidSpec} when MIH_FAULT names no catalogued fault, listing them.
Fault current();
/// Throws as current(): called by every rank at start, so a typo in MIH_FAULT is an error,
/// never a silent fault-free run.
void check_environment();

/// "F01" ... "F32"; "" for kNone.
std::string name(Fault f);
/// "F01" (case-insensitive, "f1" and "F1" too) -> kF01; "" and "none" -> kNone.
/// Throws: mih::Error{kInvalidSpec} naming the text and the valid IDs.
Fault parse(std::string_view text);
/// Every fault, F01 first.
std::vector<Fault> all();

/// Sets this process's fault for its lifetime, then puts the previous one back (unit tests
/// of a fault point in one process: threads as ranks); clears reached() when made.
class ScopedFault {
 public:
  explicit ScopedFault(Fault f);
  ~ScopedFault();
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;

 private:
  int previous_;
};

}  // namespace mih::fault
