// The evidence store: atomic writes that survive a writer killed mid-write, whole-line JSONL
// under concurrent appenders, paths that escape the directory refused, the integration state
// machine's rules, and environment capture.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/evidence/evidence_store.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(EvidenceDirTest, WritesAndReadsJsonAndJsonl) {
  EvidenceDir dir(testing::temp_dir("evidence_rw"));
  dir.write_json("check/findings.json", {{"status", "PASS"}});
  EXPECT_EQ(dir.read_json("check/findings.json")["status"], "PASS");
  dir.append_jsonl("cases/runtime/metrics.jsonl", {{"step", 0}});
  dir.append_jsonl("cases/runtime/metrics.jsonl", {{"step", 1}});
  auto rows = dir.read_jsonl("cases/runtime/metrics.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1]["step"], 1);
}

TEST(EvidenceDirTest, PathsThatEscapeAreRefused) {
  const fs::path root = testing::temp_dir("evidence_escape");
  EvidenceDir dir(root / "case");
  EXPECT_THAT([&] { dir.resolve("../other/x.json"); }, ThrowsMessage<Error>(HasSubstr("escapes the evidence directory")));
  EXPECT_THAT([&] { dir.resolve("/etc/passwd"); }, ThrowsMessage<Error>(HasSubstr("must be relative")));
  fs::create_directories(root / "outside");
  fs::create_directory_symlink(root / "outside", root / "case" / "link");
  EXPECT_THAT([&] { dir.write_json("link/x.json", {}); }, ThrowsMessage<Error>(HasSubstr("through a symlink")));
  EXPECT_FALSE(fs::exists(root / "outside" / "x.json"));
}

TEST(EvidenceDirTest, UnwritableRootIsNamed) {
  const fs::path file = testing::temp_dir("evidence_file") / "f";
  EvidenceDir(testing::temp_dir("evidence_file")).write_text("f", "x");
  EXPECT_THAT([&] { EvidenceDir bad(file / "case"); },
              ThrowsMessage<Error>(HasSubstr("cannot be created")));
}

TEST(EvidenceDirTest, ConcurrentAppendsStayWholeLines) {
  EvidenceDir dir(testing::temp_dir("evidence_jsonl"));
  const std::string payload(3000, 'x');
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) dir.append_jsonl("probes/rank0.jsonl", {{"thread", t}, {"i", i}, {"pad", payload}});
    });
  }
  for (auto& th : threads) th.join();
  auto rows = dir.read_jsonl("probes/rank0.jsonl");  // throws if any line is mixed
  EXPECT_EQ(rows.size(), 800u);
}

// Writers append whole lines (append_whole), so a last line without its newline is damage
// (a truncated or edited file): reading it is an error naming the file, never fewer rows.
TEST(EvidenceDirTest, TornLastLineIsAnError) {
  EvidenceDir dir(testing::temp_dir("evidence_torn"));
  dir.write_text("m.jsonl", "{\"a\": 1}\n{\"a\": 2}\n{\"a\"");
  EXPECT_THAT([&] { dir.read_jsonl("m.jsonl"); },
              ThrowsMessage<Error>(HasSubstr("m.jsonl ends in the middle of a line: it was truncated or edited")));
  dir.write_text("m.jsonl", "{\"a\": 1}\n{\"a\": 2}\n");
  EXPECT_EQ(dir.read_jsonl("m.jsonl").size(), 2u);
  dir.write_text("bad.jsonl", "{\"a\": 1}\nnot json\n");
  EXPECT_THAT([&] { dir.read_jsonl("bad.jsonl"); }, ThrowsMessage<Error>(HasSubstr("bad.jsonl line 2 is not JSON")));
}

// A child rewrites a 4 MB JSON file in a loop; the parent SIGKILLs it the moment its temp file
// appears (mid-write, before the rename), three times. The file is always whole (an older
// version or none), and reopening the directory removes the dead writer's temp file.
TEST(EvidenceDirTest, WriterKilledMidWriteLeavesNoPartialFile) {
  const fs::path root = testing::temp_dir("evidence_kill");
  int killed_mid_write = 0;  // kills that left a temp file: the case this test is about
  auto temp_present = [&] {
    for (const auto& e : fs::directory_iterator(root)) {
      if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
    }
    return false;
  };
  for (int round = 0; round < 3; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        EvidenceDir dir(root);
        nlohmann::json big = nlohmann::json::array();
        for (int i = 0; i < 200000; ++i) big.push_back(i);
        for (int round = 0;; ++round) dir.write_json("big.json", {{"round", round}, {"values", big}});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer: %s\n", e.what());
      }
      ::_exit(3);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!temp_present() && std::chrono::steady_clock::now() < deadline) {
    }
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "the writer ended on its own: status " << status;
    for (const auto& e : fs::directory_iterator(root)) {
      killed_mid_write += e.path().filename().string().find(".tmp.") != std::string::npos;
    }
    EvidenceDir reopened(root);
    if (fs::exists(root / "big.json")) {
      nlohmann::json j = reopened.read_json("big.json");  // throws on half a file
      EXPECT_EQ(j["values"].size(), 200000u);
    }
    for (const auto& e : fs::directory_iterator(root)) {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path() << " left behind";
    }
  }
  EXPECT_GT(killed_mid_write, 0) << "no kill landed during a write; the test proved nothing";
}

TEST(IntegrationStateTest, GatesAdvanceOneAtATimeAndTerminalIsFinal) {
  EvidenceDir dir(testing::temp_dir("evidence_state"));
  IntegrationStateMachine sm(dir);
  IntegrationState s;
  EXPECT_FALSE(sm.current(&s));
  EXPECT_THAT([&] { sm.update(IntegrationState::kStructureValidated, {}); },
              ThrowsMessage<Error>(HasSubstr("(none) -> STRUCTURE_VALIDATED is not allowed")));
  sm.update(IntegrationState::kDiscovered, {"environment.json"});
  sm.update(IntegrationState::kStructureValidated, {"check/findings.json"});
  EXPECT_THAT([&] { sm.update(IntegrationState::kMatrixPassed, {}); }, ThrowsMessage<Error>(HasSubstr("no skipping")));
  EXPECT_THAT([&] { sm.update(IntegrationState::kDiscovered, {}); }, ThrowsMessage<Error>(HasSubstr("never back")));
  // Restart-safe: already past DISCOVERED, nothing happens; MATRIX_PASSED walks the gates.
  sm.advance_if_before(IntegrationState::kDiscovered, {});
  ASSERT_TRUE(sm.current(&s));
  EXPECT_EQ(s, IntegrationState::kStructureValidated);
  sm.advance_if_before(IntegrationState::kMatrixPassed, {"comparison.json"});
  ASSERT_TRUE(sm.current(&s));
  EXPECT_EQ(s, IntegrationState::kMatrixPassed);
  sm.fail("a rank died", {"run.json"});
  nlohmann::json j = dir.read_json("integration_state.json");
  EXPECT_EQ(j["state"], "FAILED");
  EXPECT_EQ(j["previous_state"], "MATRIX_PASSED");
  EXPECT_EQ(j["reason"], "a rank died");
  EXPECT_EQ(j["evidence"], nlohmann::json({"check/findings.json", "comparison.json", "environment.json", "run.json"}));
  EXPECT_THAT([&] { sm.update(IntegrationState::kDiscovered, {}); },
              ThrowsMessage<Error>(HasSubstr("is terminal (FAILED)")));
  EXPECT_THAT([&] { sm.advance_if_before(IntegrationState::kDiscovered, {}); },
              ThrowsMessage<Error>(HasSubstr("is terminal (FAILED)")));
}

TEST(EnvironmentTest, RecordsHostCompilerGitAndVariables) {
  ::setenv("MIH_TEST_MARKER", "42", 1);
  nlohmann::json env = capture_environment(MIH_TEST_SOURCE_DIR, {{"backend", "gloo"}});
  EXPECT_FALSE(env["host"].get<std::string>().empty());
  EXPECT_GE(env["cpu"]["cores"].get<int64_t>(), 1);
  EXPECT_EQ(env["variables"]["MIH_TEST_MARKER"], "42");
  EXPECT_EQ(env["backend"], "gloo");
  EXPECT_TRUE(env.contains("git"));
  ::unsetenv("MIH_TEST_MARKER");
}

}  // namespace
}  // namespace mih
