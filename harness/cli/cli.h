// The `mih` command line: subcommands over the runtime (selftest now; the conformance matrix,
// faults and verify-only runs later). `mih --help` lists them.
#pragma once

namespace mih {

/// Runs `mih <subcommand> ...`; returns the process exit status (0 ok, 1 failed checks,
/// 2 usage error, exit_status(code) for a mih::Error).
int cli_main(int argc, char** argv);

}  // namespace mih
