// The `mih` command line (the command table is in commands.h) and the main() of a
// conformance binary, which is the GoogleTest runner of its suites, the rank worker and the
// CLI in one.
#pragma once

namespace mih {

/// Runs `mih <subcommand> ...`; returns the process exit status (0 ok, 1 failed checks,
/// 2 usage error, exit_status(code) for a mih::Error).
int cli_main(int argc, char** argv);

/// The main() of a conformance binary: `worker ...` runs a rank; a subcommand, --help or
/// --version is the CLI; conformance or --gtest_* flags run the linked suites, and so does no
/// argument when `tests_by_default` (a binary of mih_add_conformance_suite; the `mih` command
/// prints its help instead).
int conformance_main(int argc, char** argv, bool tests_by_default);

/// Whether conformance_main(argc, argv, tests_by_default) runs a command that stops on SIGINT
/// or SIGTERM and exits 128 + the signal (`test`, `check`, `run`, the suites): it installs its
/// handlers (runtime/launcher.h's install_interrupt_handlers) before anything else runs.
bool catches_interrupts(int argc, char** argv, bool tests_by_default);

}  // namespace mih
