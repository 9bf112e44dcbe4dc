// Entry point of the mih core binary (libexec/mih/mih-core, which the `mih` front runs): the
// CLI, and the conformance binary of the reference specs (`mih test`, `mih check`); `worker`
// runs a rank; `__warm-serve` is the warm server (harness/warm/warm.h).
#include "harness/cli/cli.h"
#include "harness/runtime/fork_server.h"
#include "harness/warm/warm.h"

namespace {
// One command, from exec or forked by the warm server; never returns.
int command_main(int argc, char** argv) { mih::end_process(mih::conformance_main(argc, argv, /*tests_by_default=*/false)); }
}  // namespace

int main(int argc, char** argv) {
  // First: a server must fork its commands from the state exec left.
  if (int status = 0; mih::warm::serve_if_asked(argc, argv, command_main, &status)) return status;
  return command_main(argc, argv);
}
