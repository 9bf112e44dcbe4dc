// The `mih` command as a test runs it: the binary beside the test executable, through the shell,
// everything it prints captured with its exit status.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"

namespace mih::testing {

struct CliRun {
  int status = -1;      ///< the exit status; 128 + signal when killed; -1 when it could not start
  std::string output;   ///< stdout and stderr
};

/// Runs `mih <args>` (args are shell words) in directory `cwd` when given.
inline CliRun run_mih(const std::string& args, const std::filesystem::path& cwd = {}) {
  std::string command = shell_quote((self_executable().parent_path() / "mih").string()) + " " + args + " 2>&1";
  if (!cwd.empty()) command = "cd " + shell_quote(cwd.string()) + " && " + command;
  CliRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return run;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) run.output.append(buffer.data(), n);
  const int raw = ::pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return run;
}

}  // namespace mih::testing
