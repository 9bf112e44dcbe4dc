// The evidence contract's validator (harness/contract/contract.h) on case directories built
// file by file: each way a directory can break the contract is refused naming the file and the
// field, and what the contract allows passes. The whole main job's evidence is validated by
// ctest reference/contract (tests/evidence/contract_check.py), with a second implementation.
#include "harness/contract/contract.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

const std::string kHash(64, 'a');

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << text;
}

json identity_row(int step) {
  return {{"step", step}, {"global", kHash}, {"fields", {{"input_ids", kHash}}}, {"rows", 8}};
}

// A case directory of a foreign writer: the stamp, one JSONL file, one CSV.
fs::path valid_case(const std::string& name) {
  const fs::path dir = testing::temp_dir(name);
  write(dir / "environment.json", json{{contract::kStampKey, contract::stamp("trainer-x 1.0 (test)")}}.dump());
  write(dir / "data/input_identity.jsonl", identity_row(0).dump() + "\n" + identity_row(1).dump() + "\n");
  write(dir / "check/parameter_ownership.csv",
        "fqn,owner,aliases,gradient_kind,grad_domain,placements,global_shape,local_shape,dtype,device,fsdp_unit\n"
        "w,,,DENSE,,\"tp=Shard(0, partitions=2|3)\",[4x4],[2x4],float32,cpu,root\n");
  return dir;
}

std::string texts(const contract::Validation& v) { return contract::summary(v, 20); }

TEST(EvidenceContractTest, AForeignWritersValidDirectoryPassesAndNamesItsWriter) {
  const fs::path dir = valid_case("contract_valid");
  const contract::Validation v = contract::validate_case_dir(dir);
  EXPECT_TRUE(v.ok()) << texts(v);
  EXPECT_EQ(v.writer, "trainer-x 1.0 (test)");
  EXPECT_EQ(v.files, 3);
  EXPECT_EQ(v.values, 3);  // environment.json and two lines
}

TEST(EvidenceContractTest, AFieldOfTheWrongTypeIsNamedWithItsFileAndLine) {
  const fs::path dir = valid_case("contract_type");
  json bad = identity_row(1);
  bad["rows"] = "8";
  write(dir / "data/input_identity.jsonl", identity_row(0).dump() + "\n" + bad.dump() + "\n");
  const contract::Validation v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(1)) << texts(v);
  EXPECT_EQ(v.problems[0].file, "data/input_identity.jsonl");
  EXPECT_EQ(v.problems[0].field, "line 2: rows");
  EXPECT_THAT(v.problems[0].text(), HasSubstr("data/input_identity.jsonl: field line 2: rows"));
}

TEST(EvidenceContractTest, AMissingRequiredFieldAndABadHashAreNamed) {
  const fs::path dir = valid_case("contract_required");
  json row = identity_row(0);
  row.erase("global");
  json bad_hash = identity_row(1);
  bad_hash["fields"]["input_ids"] = "not a hash";
  write(dir / "data/input_identity.jsonl", row.dump() + "\n" + bad_hash.dump() + "\n");
  const contract::Validation v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(2)) << texts(v);
  EXPECT_THAT(v.problems[0].message, HasSubstr("global"));
  EXPECT_EQ(v.problems[1].field, "line 2: fields.input_ids");
}

TEST(EvidenceContractTest, DamagedJsonIsAProblemNeverAThrow) {
  const fs::path dir = valid_case("contract_damaged");
  write(dir / "data/input_identity.jsonl", identity_row(0).dump() + "\n{\"step\": 1");  // truncated
  write(dir / "check/findings.json", "{\"a\": 1, \"a\": 2}");                           // a key twice
  write(dir / "check/structure.json", std::string(200, '[') + std::string(200, ']'));   // too deep
  const contract::Validation v = contract::validate_case_dir(dir);
  const std::string all = texts(v);
  EXPECT_THAT(all, HasSubstr("data/input_identity.jsonl: field line 2: the last line has no newline"));
  EXPECT_THAT(all, HasSubstr("check/findings.json: the key 'a' appears twice"));
  EXPECT_THAT(all, HasSubstr("check/structure.json: is not JSON mih reads: arrays and objects nested deeper"));
}

TEST(EvidenceContractTest, AFileNoEntryNamesIsRefusedUnlessUnderExtra) {
  const fs::path dir = valid_case("contract_unknown");
  write(dir / "check/notes.txt", "mine");
  contract::Validation v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(1)) << texts(v);
  EXPECT_EQ(v.problems[0].file, "check/notes.txt");
  EXPECT_THAT(v.problems[0].message, HasSubstr("no entry of the evidence contract"));
  fs::remove(dir / "check/notes.txt");
  write(dir / "extra/notes.txt", "mine");
  write(dir / "before_save/extra/deeper/more.bin", "mine");
  v = contract::validate_case_dir(dir);
  EXPECT_TRUE(v.ok()) << texts(v);
}

TEST(EvidenceContractTest, ASymlinkIsNeverFollowed) {
  const fs::path dir = valid_case("contract_symlink");
  ASSERT_EQ(::symlink("/etc/passwd", (dir / "check/structure.json").c_str()), 0);
  ASSERT_EQ(::symlink("/etc", (dir / "probes").c_str()), 0);
  const contract::Validation v = contract::validate_case_dir(dir);
  const std::string all = texts(v);
  EXPECT_THAT(all, HasSubstr("check/structure.json: is a symlink"));
  EXPECT_THAT(all, HasSubstr("probes: is a symlink"));
  EXPECT_THAT(v.problems, SizeIs(2)) << all;
}

TEST(EvidenceContractTest, TheStampIsRequiredAndAnotherContractVersionIsNamed) {
  const fs::path dir = valid_case("contract_stamp");
  json env = json::object();
  write(dir / "environment.json", env.dump());
  contract::Validation v = contract::validate_case_dir(dir);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.problems[0].file, "environment.json");
  EXPECT_THAT(v.problems[0].message, HasSubstr(contract::kStampKey));
  env[contract::kStampKey] = contract::stamp("trainer-x 2.0");
  env[contract::kStampKey]["version"] = 2;
  write(dir / "environment.json", env.dump());
  v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(1)) << texts(v);
  EXPECT_EQ(v.problems[0].field, "evidence_contract.version");
  EXPECT_THAT(v.problems[0].message, HasSubstr("this mih reads version 1"));
  fs::remove(dir / "environment.json");
  EXPECT_FALSE(contract::validate_case_dir(dir).ok());
  EXPECT_TRUE(contract::validate_case_dir(dir, /*require_stamp=*/false).ok()) << "a case that never trained has none";
}

TEST(EvidenceContractTest, ACsvRowWithAnotherFieldCountOrAnotherHeaderIsNamed) {
  const fs::path dir = valid_case("contract_csv");
  const std::string header =
      "fqn,owner,aliases,gradient_kind,grad_domain,placements,global_shape,local_shape,dtype,device,fsdp_unit\n";
  write(dir / "check/parameter_ownership.csv", header + "w,,,DENSE,,tp=Shard(0, partitions=2|3),[4x4],[2x4],float32,cpu,root\n");
  contract::Validation v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(1)) << texts(v);
  EXPECT_EQ(v.problems[0].field, "line 2");
  EXPECT_THAT(v.problems[0].message, HasSubstr("12 fields, the header has 11"));
  write(dir / "check/parameter_ownership.csv", "fqn,owner\nw,\n");
  v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(1)) << texts(v);
  EXPECT_THAT(v.problems[0].message, HasSubstr("the header is not the contract's columns"));
}

TEST(EvidenceContractTest, HostileTextIsAProblemNeverACrashOrAForgedLine) {
  const fs::path dir = valid_case("contract_hostile");
  // A NUL byte would end the parse early: what follows it is never read as valid.
  write(dir / "data/input_identity.jsonl", identity_row(0).dump() + std::string(1, '\0') + "{{{\n");
  // A stamp of the wrong shape: the writer a number.
  json env = {{contract::kStampKey, contract::stamp("x")}};
  env[contract::kStampKey]["writer"] = 5;
  write(dir / "environment.json", env.dump());
  // A file name with a newline and an escape sequence.
  write(dir / "check/a\nINVALID  forged\x1b[31m", "{}");
  contract::Validation v = contract::validate_case_dir(dir);
  const std::string all = texts(v);
  EXPECT_THAT(all, HasSubstr("data/input_identity.jsonl: holds a NUL byte at offset"));
  EXPECT_THAT(all, HasSubstr("environment.json: field evidence_contract.writer: Value type not permitted by 'type' "
                             "constraint (the value is number 5)"));
  EXPECT_THAT(all, HasSubstr("check/a\\x0aINVALID  forged\\x1b[31m: no entry"));
  EXPECT_EQ(all.find("\nINVALID"), std::string::npos) << all;
  // A writer with a control character, and CRLF line ends in the CSV (RFC 4180's own).
  env[contract::kStampKey]["writer"] = "trainer\nINVALID";
  write(dir / "environment.json", env.dump());
  fs::remove(dir / "check/a\nINVALID  forged\x1b[31m");
  write(dir / "data/input_identity.jsonl", identity_row(0).dump() + "\n");
  write(dir / "check/parameter_ownership.csv",
        "fqn,owner,aliases,gradient_kind,grad_domain,placements,global_shape,local_shape,dtype,device,fsdp_unit\r\n"
        "w,,,DENSE,,Replicate(),[4x4],[4x4],float32,cpu,root\r\n");
  v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(1)) << texts(v);
  EXPECT_EQ(v.problems[0].field, "evidence_contract.writer");
  EXPECT_THAT(v.problems[0].message, HasSubstr("control character"));
}

TEST(EvidenceContractTest, NestedPhasesFollowTheSameContract) {
  const fs::path dir = valid_case("contract_nested");
  json bad = identity_row(0);
  bad["step"] = -1;
  write(dir / "before_save/data/input_identity.jsonl", bad.dump() + "\n");
  const contract::Validation v = contract::validate_case_dir(dir);
  ASSERT_THAT(v.problems, SizeIs(1)) << texts(v);
  EXPECT_EQ(v.problems[0].file, "before_save/data/input_identity.jsonl");
  EXPECT_EQ(v.problems[0].field, "line 1: step");
}

TEST(EvidenceContractTest, EveryManifestSchemaIsCompiledInAndValidatesAValue) {
  const auto& files = contract::compiled_files();
  const json manifest = json::parse(files.at("contract.json"));
  EXPECT_EQ(manifest["contract"], contract::kName);
  EXPECT_EQ(manifest["version"], contract::kVersion);
  int schemas = 0;
  for (const json& e : manifest["files"]) {
    if (!e.contains("schema")) continue;
    ++schemas;
    EXPECT_TRUE(files.count(e["schema"].get<std::string>())) << e.dump();
    // A concrete path of the entry: every placeholder a value its pattern takes.
    std::string path = e["path"];
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"<k>", "1"}, {"<r>", "0"}, {"<phase>", "train"},
                                   {"<event>", "save"}}) {
      for (size_t at; (at = path.find(from)) != std::string::npos;) path.replace(at, from.size(), to);
    }
    // A string is no file's value: each schema is real enough to refuse it.
    EXPECT_THAT(contract::validate_value(path, json("not evidence")), SizeIs(1)) << path;
  }
  EXPECT_GT(schemas, 40);
  EXPECT_THROW(contract::validate_value("nowhere/else.json", json::object()), Error);
}

}  // namespace
}  // namespace mih
