// The `mih` command table (internal to harness/cli): one row per subcommand, each with the
// function that declares its options on its CLI11 subcommand and returns what runs it once
// the command line is parsed. cli.cpp walks the table; nothing registers itself.
//
// How to add a command: write `CommandRun setup_<name>(CLI::App& sub, const Invocation& inv)`
// in the file of its kind (launch_commands.cpp, evidence_commands.cpp, conformance_command.cpp,
// scaffold_command.cpp, reach_command.cpp, golden_command.cpp, submit_command.cpp),
// declare it below and add a row to commands() in cli.cpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace mih::cli {

/// The process's command line, for commands that record it (run.json).
struct Invocation {
  int argc = 0;
  char** argv = nullptr;
};

/// What runs a parsed command; returns the exit status (errors thrown as mih::Error).
using CommandRun = std::function<int()>;
using CommandSetup = CommandRun (*)(CLI::App& sub, const Invocation& inv);

struct Command {
  std::string name;
  std::string help;
  CommandSetup setup;
  /// Everything after the name goes to the command unparsed (test, check, faults, worker).
  bool pass_through = false;
};

/// Every command, in the order `mih --help` lists them.
const std::vector<Command>& commands();

/// "mih 0.1.0 (libtorch 1.13.1; backends: gloo)".
std::string version_text();

// The setup functions of the table.
CommandRun setup_selftest(CLI::App& sub, const Invocation& inv);
CommandRun setup_launch(CLI::App& sub, const Invocation& inv);
CommandRun setup_export(CLI::App& sub, const Invocation& inv);
CommandRun setup_inspect(CLI::App& sub, const Invocation& inv);
CommandRun setup_golden(CLI::App& sub, const Invocation& inv);
CommandRun setup_scaffold(CLI::App& sub, const Invocation& inv);
CommandRun setup_matrix(CLI::App& sub, const Invocation& inv);
CommandRun setup_list(CLI::App& sub, const Invocation& inv);
CommandRun setup_compare(CLI::App& sub, const Invocation& inv);
CommandRun setup_validate(CLI::App& sub, const Invocation& inv);
CommandRun setup_run(CLI::App& sub, const Invocation& inv);
CommandRun setup_submit(CLI::App& sub, const Invocation& inv);
CommandRun setup_test(CLI::App& sub, const Invocation& inv);
CommandRun setup_check(CLI::App& sub, const Invocation& inv);
CommandRun setup_report(CLI::App& sub, const Invocation& inv);
CommandRun setup_reach(CLI::App& sub, const Invocation& inv);
CommandRun setup_faults(CLI::App& sub, const Invocation& inv);
CommandRun setup_warm(CLI::App& sub, const Invocation& inv);

/// `mih test` / `mih check`: the conformance suites linked into this binary (args after the
/// command name). Exit status as the README's "Exit codes".
int run_conformance_tests(const std::vector<std::string>& args);

}  // namespace mih::cli
