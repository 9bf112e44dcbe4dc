// The main() of a conformance binary made by mih_add_conformance_suite: no argument runs the
// suites; `worker` runs a rank; a mih subcommand (list, matrix, run, check, report...) runs
// the CLI. See harness/cli/cli.h and suites/conformance.h.
#include "harness/cli/cli.h"
#include "harness/runtime/fork_server.h"

int main(int argc, char** argv) { mih::end_process(mih::conformance_main(argc, argv, /*tests_by_default=*/true)); }
