// The llama spec's suites trained by the plain backend (plain_backend.cpp) over world-size-1
// cases (plain_matrix.json): a reference, gradient accumulation and a resume. Proves a backend
// other than mih's Trainer runs every suite that applies to it.
#include "suites/conformance.h"

#ifndef MIH_PLAIN_MATRIX  // set by CMake to the absolute path
#define MIH_PLAIN_MATRIX "tests/conformance/plain_matrix.json"
#endif

MIH_CONFORMANCE_SUITES_WITH_BACKEND(PlainLlama, "llama", MIH_PLAIN_MATRIX, "plain");
