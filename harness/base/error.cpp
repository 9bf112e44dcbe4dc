// mih::Error and the throw helpers behind the MIH_* macros.
#include "harness/base/error.h"

namespace mih {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidSpec: return "invalid_spec";
    case Code::kFailedPrecondition: return "failed_precondition";
    case Code::kUnimplemented: return "unimplemented";
    case Code::kDeadlineExceeded: return "deadline_exceeded";
    case Code::kUnavailable: return "unavailable";
    case Code::kAborted: return "aborted";
    case Code::kInternal: return "internal";
  }
  return "unknown";
}

int exit_status(Code code) {
  return code == Code::kOk ? 0 : 10 + static_cast<int>(code);
}

Code code_from_exit_status(int status) {
  for (Code c : {Code::kInvalidSpec, Code::kFailedPrecondition, Code::kUnimplemented,
                 Code::kDeadlineExceeded, Code::kUnavailable, Code::kAborted, Code::kInternal}) {
    if (exit_status(c) == status) return c;
  }
  return Code::kOk;
}

std::string exit_status_legend() {
  std::string out = "Exit status: 0 ok; 1 checks failed; 2 usage error";
  for (Code c : {Code::kInvalidSpec, Code::kFailedPrecondition, Code::kUnimplemented, Code::kDeadlineExceeded,
                 Code::kUnavailable, Code::kAborted, Code::kInternal}) {
    out += internal::str("; ", exit_status(c), " ", code_name(c));
  }
  return out + " (a rank crashed is aborted).";
}

Error::Error(Code code, std::string message)
    : std::runtime_error(message), code_(code), message_(std::move(message)) {
  rebuild_what();
}

Error& Error::add_context(std::string line) {
  context_.push_back(std::move(line));
  rebuild_what();
  return *this;
}

void Error::rebuild_what() {
  what_ = message_;
  for (const auto& line : context_) what_ += "\n  " + line;
}

namespace internal {

void throw_error(Code code, std::string message) { throw Error(code, std::move(message)); }

void throw_internal(const char* file, int line, const char* cond, std::string message) {
  throw Error(Code::kInternal,
              str("mih internal error (a harness bug, please report it): '", cond,
                  "' does not hold at ", file, ":", line, message.empty() ? "" : ": ", message));
}

}  // namespace internal
}  // namespace mih
