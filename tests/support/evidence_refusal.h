// What the tests of harness/contract's readers share: a value written to a real file and read
// back as the evidence store reads it, and the one refusal a reader makes of a missing or
// mistyped field (kFailedPrecondition naming the file, the field and the fix).
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/evidence/evidence_store.h"
#include "tests/support/temp_dir.h"

namespace mih::testing {

/// `value` written to <temp_dir(tag)>/value.json and read back through EvidenceDir.
inline nlohmann::json written_json(const nlohmann::json& value, const std::string& tag) {
  const std::filesystem::path dir = temp_dir(tag);
  std::ofstream(dir / "value.json") << value.dump();
  return EvidenceDir::open_existing(dir).read_json("value.json");
}

/// Expects `read` to throw the readers' refusal of evidence: mih::Error{kFailedPrecondition}
/// naming an evidence file of the case ("evidence file case/..."), saying to rerun the case,
/// and holding every string of `named` (the field, the line and step).
inline void expect_evidence_refused(const std::function<void()>& read, const std::vector<std::string>& named) {
  try {
    read();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.message(), ::testing::HasSubstr("evidence file case/"));
    EXPECT_THAT(e.message(), ::testing::HasSubstr("rerun the case"));
    for (const auto& what : named) EXPECT_THAT(e.message(), ::testing::HasSubstr(what));
  }
}

}  // namespace mih::testing
