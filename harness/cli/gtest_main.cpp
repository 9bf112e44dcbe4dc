// The main() of every test and conformance binary: `<binary> worker <task>` runs a rank
// (the launcher re-executes the test binary), anything else runs the tests. Fails when no
// test is linked: a static archive silently drops registrations, and gtest 1.12 has no
// --gtest_fail_if_no_test_linked.
#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

#include "harness/runtime/worker.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "worker") == 0) return mih::worker_main(argc - 1, argv + 1);
  testing::InitGoogleTest(&argc, argv);
  if (testing::UnitTest::GetInstance()->total_test_count() == 0) {
    std::fprintf(stderr,
                 "%s: no test is linked into this binary; put TEST/TEST_P files in the executable or an OBJECT "
                 "library (a static archive drops their registrations)\n",
                 argv[0]);
    return 1;
  }
  return RUN_ALL_TESTS();
}
