// The `mih` command line: subcommands over the runtime (selftest now; the conformance matrix,
// faults and verify-only runs later). `mih --help` lists them.
#pragma once

#include <string>
#include <vector>

namespace mih {

/// What `mih test [args]` and `mih check <evidence> [args]` call (the latter as
/// {"--check", <evidence>, args...}): runs the linked conformance suites and returns the exit
/// status. Set by suites/conformance.cpp when the suites are linked.
using ConformanceRunner = int (*)(const std::vector<std::string>& args);
void set_conformance_runner(ConformanceRunner runner);

/// What `mih faults [args]` calls: the fault catalog's detection matrix (suites/faults.h).
/// Set by suites/faults.cpp when the suites are linked.
void set_faults_runner(ConformanceRunner runner);

/// Runs `mih <subcommand> ...`; returns the process exit status (0 ok, 1 failed checks,
/// 2 usage error, exit_status(code) for a mih::Error).
int cli_main(int argc, char** argv);

}  // namespace mih
