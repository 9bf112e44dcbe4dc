// The bounds on JSON from outside: nesting depth before a value exists, no input quoted in a
// parse error, a bounded rendering of any value in a message.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string nested(int depth) {
  return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']');
}

TEST(JsonFieldsTest, DepthCountsBracketsOutsideStringsOnly) {
  EXPECT_TRUE(json_depth_within(nested(kMaxJsonDepth)));
  EXPECT_FALSE(json_depth_within(nested(kMaxJsonDepth + 1)));
  EXPECT_FALSE(json_depth_within("{\"a\": " + nested(100000) + "}"));
  EXPECT_TRUE(json_depth_within("\"" + std::string(1000, '[') + "\""));
  EXPECT_TRUE(json_depth_within(R"(["\"[[[[", {"k": "\\"}])", 2));
  EXPECT_FALSE(json_depth_within(R"([[["\\"]]])", 2));
}

TEST(JsonFieldsTest, StrictParseRefusesDeepNestingNamingTheFile) {
  EXPECT_THAT([] { (void)parse_json_strict("{\"steps\": " + nested(100000) + "}", "case matrix file m.json"); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("case matrix file m.json"), HasSubstr("nested deeper than 128 levels"))));
  EXPECT_EQ(parse_json_strict(nested(kMaxJsonDepth), "f").dump(), nested(kMaxJsonDepth));
}

TEST(JsonFieldsTest, BoundedAndLenientParsesRefuseDeepNesting) {
  nlohmann::json out = 7;
  std::string problem;
  EXPECT_FALSE(parse_json_bounded(nested(100000), &out, &problem));
  EXPECT_THAT(problem, HasSubstr("nested deeper than 128 levels"));
  EXPECT_EQ(out, 7) << "left untouched";
  EXPECT_TRUE(parse_json_lenient(nested(100000)).is_discarded());
  EXPECT_TRUE(parse_json_lenient("{").is_discarded());
  EXPECT_EQ(parse_json_lenient(R"({"a": [1]})")["a"][0], 1);
}

TEST(JsonFieldsTest, ParseErrorsQuoteNoInput) {
  std::string problem;
  nlohmann::json out;
  EXPECT_FALSE(parse_json_bounded("root:secret:0:0", &out, &problem));
  EXPECT_THAT(problem, AllOf(HasSubstr("syntax error"), Not(HasSubstr("last read")), Not(HasSubstr("'ro"))));
  EXPECT_THAT([] { (void)parse_json_strict("{\"a\": tsecret}", "x.json"); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("x.json is not JSON"), Not(HasSubstr("tse")))));
}

TEST(JsonFieldsTest, SummaryIsBoundedHoweverLargeTheValue) {
  EXPECT_EQ(json_summary(nlohmann::json::parse(R"({"a":[1,2.5,"x"],"b":null})")), R"({"a":[1,2.5,"x"],"b":null})");
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  EXPECT_LE(json_summary(big).size(), 200u);
  EXPECT_THAT(json_summary(big), HasSubstr("..."));
  EXPECT_LE(json_summary(std::string(100000, 'x')).size(), 80u);
  const nlohmann::json deep = nlohmann::json::parse(nested(kMaxJsonDepth));
  EXPECT_EQ(json_summary(deep), "[[[[[...]]]]]");
  // A string cut inside a multi-byte character stays valid UTF-8.
  const std::string cut = json_summary(std::string(63, 'a') + "\xc3\xa9" + std::string(10, 'b'));
  EXPECT_TRUE(nlohmann::json::accept(cut.substr(0, cut.size() - 3)));
}

TEST(JsonFieldsTest, FieldErrorsPrintABoundedValue) {
  nlohmann::json j = {{"steps", std::string(100000, '7')}};
  try {
    (void)json_int(j, "steps", 3, "matrix m.json", 1, 100);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("'steps' must be an integer in [1, 100], got \"777"));
    EXPECT_LE(e.message().size(), 300u);
  }
}

}  // namespace
}  // namespace mih
