// Entry point of the `mih` binary.
#include "harness/cli/cli.h"

int main(int argc, char** argv) { return mih::cli_main(argc, argv); }
