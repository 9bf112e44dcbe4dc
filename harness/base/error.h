// mih's error type and the checking macros every component uses. Bad input throws
// mih::Error with a code; harness bugs go through MIH_INTERNAL_ASSERT. Nothing here aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mih {

/// What kind of failure an Error reports. The meanings follow Abseil's status codes
/// (absl/status/status.h); return the most specific one that applies.
enum class Code {
  kOk = 0,
  /// A malformed spec, option, argument or environment variable (absl kInvalidArgument).
  kInvalidSpec,
  /// The world is not in the required state: wrong world size, missing file, busy dir.
  kFailedPrecondition,
  /// A feature the harness or a backend does not provide (absl kUnimplemented).
  kUnimplemented,
  /// A collective, rendezvous or case did not complete within its timeout.
  kDeadlineExceeded,
  /// Transport failure: a peer rank died or closed its connection, a store is unreachable.
  kUnavailable,
  /// A rank failed: exited non-zero or was killed by a signal (reported by the launcher).
  kAborted,
  /// A harness bug (an internal invariant does not hold).
  kInternal,
};

/// Returns the lower-case name of `code` ("deadline_exceeded"), as written in evidence.
std::string_view code_name(Code code);

/// Returns the process exit status for `code`: 0 for kOk, 10 + the enumerator otherwise
/// (kInvalidSpec = 11 ... kInternal = 17), so that a worker's status names its failure
/// without clashing with the 1/2 of generic failures and usage errors.
int exit_status(Code code);

/// Returns the code whose exit_status() is `status`, or kOk when none is.
Code code_from_exit_status(int status);

/// One line for --help footers: what every exit status of a mih binary means.
std::string exit_status_legend();

/// The exception every mih component throws. `message()` is the bare problem statement
/// ("'tp' must divide 'world_size': ..."); context lines are added as it propagates
/// ("while building the device mesh on rank 1/4"); what() joins both.
class Error : public std::runtime_error {
 public:
  Error(Code code, std::string message);

  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::vector<std::string>& context() const { return context_; }

  /// Appends one line of context (outermost last). Returns *this for rethrowing.
  Error& add_context(std::string line);

  const char* what() const noexcept override { return what_.c_str(); }

 private:
  void rebuild_what();

  Code code_;
  std::string message_;
  std::vector<std::string> context_;
  std::string what_;
};

namespace internal {

/// Concatenates the parts with operator<< (like c10::str).
template <class... Parts>
std::string str(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

[[noreturn]] void throw_error(Code code, std::string message);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 std::string message);

}  // namespace internal

/// Runs `fn`; if it throws mih::Error, adds `context` to it and rethrows. Other exceptions
/// become Error{kInternal} with their what() and the context, so nothing escapes unnamed.
template <class Fn>
decltype(auto) with_context(const std::string& context, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (Error& e) {
    e.add_context(context);
    throw;
  } catch (const std::exception& e) {
    Error wrapped(Code::kInternal, e.what());
    wrapped.add_context(context);
    throw wrapped;
  }
}

}  // namespace mih

/// Throws mih::Error{code} with the parts concatenated, unconditionally.
#define MIH_THROW(code, ...) ::mih::internal::throw_error((code), ::mih::internal::str(__VA_ARGS__))

/// Throws mih::Error{kInvalidSpec} built from the parts if `cond` is false. For bad input:
/// "<what>: expected <x>, got <y>", valid choices listed, the fix when obvious.
#define MIH_CHECK(cond, ...)                                   \
  do {                                                         \
    if (!(cond)) MIH_THROW(::mih::Code::kInvalidSpec, __VA_ARGS__); \
  } while (false)

/// Like MIH_CHECK with an explicit code (kFailedPrecondition, kUnimplemented, ...).
#define MIH_CHECK_CODE(cond, code, ...)        \
  do {                                         \
    if (!(cond)) MIH_THROW((code), __VA_ARGS__); \
  } while (false)

/// Throws mih::Error{kInternal} naming the file, line and condition: a harness bug.
#define MIH_INTERNAL_ASSERT(cond, ...)                                            \
  do {                                                                            \
    if (!(cond))                                                                  \
      ::mih::internal::throw_internal(__FILE__, __LINE__, #cond,                  \
                                      ::mih::internal::str("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (false)
