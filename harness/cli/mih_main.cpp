// Entry point of the `mih` command: the CLI, and the conformance binary of the reference
// specs (`mih test`, `mih check`); `mih worker` runs a rank.
#include "harness/cli/cli.h"

int main(int argc, char** argv) { return mih::conformance_main(argc, argv, /*tests_by_default=*/false); }
