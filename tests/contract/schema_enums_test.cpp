// The schemas' enums (schemas/evidence/v1, as compiled into the binary) hold exactly the names of
// the C++ enums that write them: an outcome, integration state, dtype, case kind, CP layout, pp
// schedule, error code, severity, gradient kind or finding code (codes.h) added on one side and
// not on the other is named here, and a planted extra or missing name is caught.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/parallel_config.h"
#include "harness/base/pipeline_schedule.h"
#include "harness/base/reduction_paths.h"
#include "harness/contract/case_outcome.h"
#include "harness/contract/case_request.h"
#include "harness/contract/contract.h"
#include "harness/evidence/evidence_store.h"
#include "harness/findings/findings.h"

namespace mih {
namespace {

using nlohmann::json;
using Names = std::set<std::string>;

// The names of enum E by its name function: enumerators 0, 1, ... until the function throws,
// returns a sentinel ("?", "unknown", "") or a name already seen (a function that maps every
// other value to a default), so an enumerator added to E is listed without editing this test.
template <typename E, typename NameOf>
Names names_of(NameOf name_of) {
  Names out;
  for (int i = 0; i < 64; ++i) {
    std::string name;
    try {
      name = std::string(name_of(static_cast<E>(i)));
    } catch (const std::exception&) {
      break;
    }
    if (name.empty() || name == "?" || name == "unknown" || !out.insert(name).second) break;
  }
  return out;
}

// The enum at JSON pointer `pointer` of compiled schema `file`, its strings (null as "null").
Names schema_enum(const json& schema, const std::string& file, const std::string& pointer) {
  const json::json_pointer at(pointer);
  if (!schema.contains(at) || !schema.at(at).is_array()) {
    throw std::runtime_error(file + " has no enum at " + pointer);
  }
  Names out;
  for (const auto& v : schema.at(at)) out.insert(v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}

json compiled_schema(const std::string& file) {
  const auto& files = contract::compiled_files();
  const auto it = files.find(file);
  if (it == files.end()) throw std::runtime_error("no compiled schema " + file);
  return json::parse(it->second);
}

std::string listed(const Names& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out.empty() ? "none" : out;
}

// Success when the schema's enum equals the C++ names; else the names only one side holds.
::testing::AssertionResult same_names(const std::string& where, const Names& schema, const Names& cpp) {
  Names extra, missing;
  for (const auto& n : schema) {
    if (!cpp.count(n)) extra.insert(n);
  }
  for (const auto& n : cpp) {
    if (!schema.count(n)) missing.insert(n);
  }
  if (extra.empty() && missing.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << where << ": the schema's enum names " << listed(extra)
                                     << " that the C++ enum lacks, and lacks " << listed(missing)
                                     << " that the C++ enum names; make them one list";
}

::testing::AssertionResult schema_matches(const std::string& file, const std::string& pointer, const Names& cpp) {
  return same_names(file + " " + pointer, schema_enum(compiled_schema(file), file, pointer), cpp);
}

Names with(Names names, const std::vector<std::string>& more) {
  names.insert(more.begin(), more.end());
  return names;
}

Names without(Names names, const std::vector<std::string>& less) {
  for (const auto& n : less) names.erase(n);
  return names;
}

Names outcomes() { return names_of<Outcome>(outcome_name); }
Names states() { return names_of<IntegrationState>(state_name); }
Names dtypes() { return names_of<DType>(dtype_name); }

TEST(SchemaEnumsTest, NameFunctionsListEveryEnumerator) {
  EXPECT_EQ(outcomes().size(), 8u) << listed(outcomes());
  EXPECT_EQ(states().size(), 6u) << listed(states());
  EXPECT_EQ(dtypes().size(), 4u) << listed(dtypes());
  EXPECT_EQ(names_of<CpLayout>(cp_layout_name).size(), 2u);
}

TEST(SchemaEnumsTest, OutcomesAreTheCaseOutcomes) {
  // A verify-only run writes no case_run.json (CaseRecord refuses the outcome), so the record's
  // enum is every other outcome.
  EXPECT_TRUE(schema_matches("case_run.schema.json", "/properties/outcome/enum", without(outcomes(), {"verify_only"})));
}

TEST(SchemaEnumsTest, IntegrationStatesAreTheStateMachines) {
  EXPECT_TRUE(schema_matches("integration_state.schema.json", "/properties/state/enum", states()));
  EXPECT_TRUE(schema_matches("integration_state.schema.json", "/properties/previous_state/enum", with(states(), {"null"})));
  // case_run.json says "NONE" for a case that recorded no integration state.
  EXPECT_TRUE(schema_matches("case_run.schema.json", "/properties/state/enum", with(states(), {"NONE"})));
}

TEST(SchemaEnumsTest, ConfigEnumsAreParallelConfigs) {
  const Names layouts = names_of<CpLayout>(cp_layout_name);
  const Names schedules = names_of<pp::ScheduleKind>(pp::schedule_name);
  for (const auto& [file, config] : {std::pair{"case_run.schema.json", "/properties/config"},
                                     std::pair{"config.resolved.schema.json", ""},
                                     std::pair{"run.case.schema.json", "/properties/case/properties/config"},
                                     std::pair{"run.case.schema.json", "/properties/case/properties/save_config"},
                                     std::pair{"environment.schema.json", "/properties/case/properties/config"},
                                     std::pair{"environment.schema.json", "/properties/case/properties/save_config"}}) {
    const std::string at = std::string(config) + "/properties/";
    EXPECT_TRUE(schema_matches(file, at + "dtype/enum", dtypes()));
    EXPECT_TRUE(schema_matches(file, at + "cp_layout/enum", layouts));
    EXPECT_TRUE(schema_matches(file, at + "pp_schedule/enum", schedules));
  }
  EXPECT_TRUE(schema_matches("compare.calibration.schema.json", "/properties/dtype/enum", dtypes()));
  EXPECT_TRUE(schema_matches("check.fsdp_trace.schema.json", "/properties/cp_layout/enum", layouts));
}

TEST(SchemaEnumsTest, CaseKindsAreCaseRequests) {
  const Names kinds = names_of<spec::CaseKind>(spec::case_kind_name);
  EXPECT_TRUE(schema_matches("case_run.schema.json", "/properties/kind/enum", kinds));
  EXPECT_TRUE(schema_matches("run.case.schema.json", "/properties/case/properties/kind/enum", kinds));
  EXPECT_TRUE(schema_matches("environment.schema.json", "/properties/case/properties/kind/enum", kinds));
}

TEST(SchemaEnumsTest, ErrorCodesAndExitStatusesAreErrors) {
  const Names codes = names_of<Code>(code_name);
  Names statuses;
  for (int i = 0; i < 64 && codes.count(std::string(code_name(static_cast<Code>(i)))); ++i) {
    statuses.insert(std::to_string(exit_status(static_cast<Code>(i))));
  }
  EXPECT_TRUE(schema_matches("run.errors.rank.schema.json", "/properties/code/enum", codes));
  EXPECT_TRUE(schema_matches("run.errors.rank.schema.json", "/properties/exit_status/enum", statuses));
  EXPECT_TRUE(schema_matches("run.init_from_failed_rank.schema.json", "/properties/code/enum", codes));
}

TEST(SchemaEnumsTest, SeveritiesAndGradientKindsAreTheirEnums) {
  EXPECT_TRUE(schema_matches("check.findings.schema.json", "/properties/findings/items/properties/severity/enum",
                             names_of<Severity>(severity_name)));
  // structure.json spells GradientKind's names in capitals (ParallelContext::gradient_kind).
  Names kinds;
  for (GradientKind k : {GradientKind::kDense, GradientKind::kExpert}) {
    std::string name(gradient_kind_name(k));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    kinds.insert(name);
  }
  for (const char* file : {"check.structure.schema.json", "check.fsdp_trace.schema.json"}) {
    EXPECT_TRUE(schema_matches(file, "/properties/parameters/items/properties/gradient_kind/enum", kinds));
  }
}

// The finding codes are constants, not an enum: the names harness/findings/codes.h defines.
Names finding_codes() {
  std::ifstream in(std::string(MIH_TEST_SOURCE_DIR) + "/../../harness/findings/codes.h");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const std::regex kCode(R"re(inline constexpr const char\* k\w+ = "(MIH-[A-Z]+-[0-9]{3})")re");
  Names out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kCode); it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1].str());
  }
  return out;
}

TEST(SchemaEnumsTest, FindingCodesAreTheCodesHeader) {
  const Names codes = finding_codes();
  ASSERT_GT(codes.size(), 40u) << "harness/findings/codes.h was not read";
  EXPECT_TRUE(schema_matches("check.findings.schema.json", "/properties/findings/items/properties/code/enum", codes));
}

TEST(SchemaEnumsTest, APlantedExtraOrMissingNameIsCaught) {
  json schema = compiled_schema("case_run.schema.json");
  const Names cpp = without(outcomes(), {"verify_only"});
  const std::string at = "/properties/outcome/enum";
  ASSERT_TRUE(same_names("case_run", schema_enum(schema, "case_run", at), cpp));

  json extra = schema;
  extra.at(json::json_pointer(at)).push_back("exploded");
  const ::testing::AssertionResult planted_extra = same_names("case_run", schema_enum(extra, "case_run", at), cpp);
  EXPECT_FALSE(planted_extra);
  EXPECT_THAT(planted_extra.message(), ::testing::HasSubstr("names 'exploded' that the C++ enum lacks"));

  json missing = schema;
  json& names = missing.at(json::json_pointer(at));
  names.erase(std::remove(names.begin(), names.end(), json("interrupted")), names.end());
  const ::testing::AssertionResult planted_missing = same_names("case_run", schema_enum(missing, "case_run", at), cpp);
  EXPECT_FALSE(planted_missing);
  EXPECT_THAT(planted_missing.message(), ::testing::HasSubstr("lacks 'interrupted' that the C++ enum names"));

  EXPECT_FALSE(same_names("an enum the C++ side grew", schema_enum(schema, "case_run", at), with(cpp, {"paused"})));
}

}  // namespace
}  // namespace mih
