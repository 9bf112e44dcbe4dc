// CLI11 conventions shared by `mih` and `<binary> worker`: validators whose messages read like
// mih's, durations in seconds (the one unit of every command line), unknown commands named,
// and usage errors that exit 2 (not CLI11's 100+ codes). Header-only; include it only from
// translation units that parse command lines.
#pragma once

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>

#include "harness/base/error.h"
#include "harness/base/printable.h"
#include "harness/base/strings.h"

namespace mih::cli {

/// Prints the exception in flight and returns its exit status; call it in `catch (...)` of a
/// command's entry point, so no exception ends the process as an abort: a mih::Error exits
/// with its code's status; a std::filesystem::filesystem_error is the environment (exit 12,
/// naming the path and the OS error); anything else is a mih bug (exit 17). The message is
/// printed as printable_message() makes it: a value it echoes neither reaches the terminal's
/// controls nor forges a line, nor is printed whole past a few hundred bytes.
inline int report_current_exception(const char* program) {
  try {
    throw;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s error: %s\n", program, std::string(code_name(e.code())).c_str(),
                 printable_message(e.what()).c_str());
    return exit_status(e.code());
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "%s: %s error: %s (%s); check the path exists, is a directory where one is expected and is "
                 "writable\n", program, std::string(code_name(Code::kFailedPrecondition)).c_str(),
                 e.code().message().c_str(), printable_message(e.path1().string()).c_str());
    return exit_status(Code::kFailedPrecondition);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s (a mih bug; please report it with the command line)\n", program,
                 printable_message(e.what()).c_str());
    return exit_status(Code::kInternal);
  } catch (...) {
    std::fprintf(stderr, "%s: internal error: an unknown exception (a mih bug)\n", program);
    return exit_status(Code::kInternal);
  }
}

/// A numeric option that must be >= `min`: "--timeout: must be >= 0.001, got '0'".
inline CLI::Validator at_least(double min) {
  return CLI::Validator(
      [min](std::string& value) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(value, &used);
          if (used != value.size() || !std::isfinite(v)) throw std::invalid_argument(value);
        } catch (const std::out_of_range&) {
          return "'" + value + "' is out of the range of a double (about 1e-308 to 1e308 in magnitude; give 0 for none)";
        } catch (const std::exception&) {
          return "expected a finite number, got '" + value + "'";
        }
        if (v < min) return internal::str("must be >= ", min, ", got '", value, "'");
        return "";
      },
      internal::str(">=", min));
}

/// An integer option in [`min`, `max`], digits only: "--from-step: expected an integer from 0
/// to 9223372036854775807, got '1e3'" (no rounding, no clamping of an overflow).
inline CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        int64_t v = 0;
        const char* end = value.data() + value.size();
        auto [ptr, ec] = std::from_chars(value.data(), end, v);
        if (value.empty() || ec != std::errc() || ptr != end || v < min || v > max) {
          return internal::str("expected an integer from ", min, " to ", max, ", got '", value, "'");
        }
        return "";
      },
      internal::str("INT in [", min, ", ", max, "]"));
}

/// A path option that may not be empty: "--init-from: an empty path; give a directory" (an
/// empty value would otherwise mean "not given").
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& value) -> std::string { return value.empty() ? "an empty path; give a directory" : ""; },
      "DIR");
}

/// A duration option given in seconds ("--case-timeout 1.5"), kept as milliseconds in
/// `target` (its value is the default shown). The value must be a finite number >= `min_s`.
inline CLI::Option* add_seconds(CLI::App& app, const std::string& name, std::chrono::milliseconds& target,
                                const std::string& help, double min_s = 0.001) {
  auto* option = app.add_option_function<std::string>(
      name,
      [&target, name, min_s](const std::string& value) {
        std::string problem = at_least(min_s)(const_cast<std::string&>(value));
        // A week at most: beyond it no run is meant, and milliseconds on the steady clock overflow.
        if (problem.empty() && std::stod(value) > 604800.0) problem = "must be <= 604800 (a week), got '" + value + "'";
        if (!problem.empty()) throw CLI::ValidationError(name, problem);
        target = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(std::stod(value) * 1000.0)));
      },
      help + " (seconds)");
  option->default_str(internal::str(static_cast<double>(target.count()) / 1000.0));
  option->type_name("SECONDS");
  return option;
}

/// Parses `argv`. Returns nullopt when the program should go on; otherwise the exit status
/// after printing: 0 for --help/--version, 2 for a usage error. When no subcommand of `app`
/// was given but a word was, the error names it and lists the valid ones (`what` is
/// "command" or "worker task").
inline std::optional<int> parse_or_exit(CLI::App& app, int argc, char** argv, const std::string& what) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (!app.get_subcommands().empty()) return std::nullopt;
  const std::string valid =
      join(app.get_subcommands([](CLI::App*) { return true; }), ", ", [](const CLI::App* sub) { return sub->get_name(); });
  const auto& extra = app.remaining();
  if (!extra.empty()) {
    std::fprintf(stderr, "%s: unknown %s '%s'; valid: [%s]\n", app.get_name().c_str(), what.c_str(),
                 printable_message(extra.front()).c_str(), valid.c_str());
  } else {
    std::fprintf(stderr, "%s: a %s is required; valid: [%s] (see --help)\n", app.get_name().c_str(), what.c_str(),
                 valid.c_str());
  }
  return 2;
}

/// Lets `app` accept unknown words so parse_or_exit can name them; its subcommands stay
/// strict. Call after adding every subcommand.
inline void name_unknown_subcommands(CLI::App& app) {
  app.require_subcommand(0, 1);
  app.allow_extras(true);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (!sub->get_prefix_command()) sub->allow_extras(false);
  }
}

}  // namespace mih::cli
