// Entry point of the mih core binary (libexec/mih/mih-core, which the `mih` front runs): the
// CLI, and the conformance binary of the reference specs (`mih test`, `mih check`); `worker`
// runs a rank; `__warm-serve` is the warm server (harness/warm/warm.h).
#include "harness/cli/cli.h"
#include "harness/runtime/fork_server.h"
#include "harness/runtime/launcher.h"
#include "harness/warm/warm.h"

namespace {
// One command, from exec or forked by the warm server; never returns. Its interrupt handlers
// go in first, then a forked command gets the signals the server held for it (an interrupt
// forwarded by the front meanwhile is delivered to them: exit 130, never lost).
int command_main(int argc, char** argv) {
  if (mih::catches_interrupts(argc, argv, /*tests_by_default=*/false)) mih::install_interrupt_handlers();
  mih::warm::release_held_signals();
  mih::end_process(mih::conformance_main(argc, argv, /*tests_by_default=*/false));
}
}  // namespace

int main(int argc, char** argv) {
  // First: a server must fork its commands from the state exec left.
  if (int status = 0; mih::warm::serve_if_asked(argc, argv, command_main, &status)) return status;
  return command_main(argc, argv);
}
