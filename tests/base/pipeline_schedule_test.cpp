// Pipeline schedules (harness/base/pipeline_schedule.h): every generated order is a valid
// step by order_problems, which judges from the order alone; each kind of planted schedule
// bug (an action dropped, run twice, on the wrong rank, a backward before its forward, a
// deadlocking order, a schedule holding more activations than its kind) is named.
#include "harness/base/pipeline_schedule.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"

namespace mih::pp {
namespace {

using ::testing::HasSubstr;
using Order = std::vector<std::vector<Action>>;

std::string texts(const std::vector<Action>& order) {
  std::string out;
  for (const Action& a : order) out += (out.empty() ? "" : " ") + a.text();
  return out;
}

std::string all(const std::vector<std::string>& problems) {
  std::string out;
  for (const auto& p : problems) out += p + "\n";
  return out;
}

Order parse(const std::vector<std::string>& ranks) {
  Order out;
  for (const std::string& r : ranks) {
    out.emplace_back();
    size_t at = 0;
    while (at < r.size()) {
      const size_t end = r.find(' ', at);
      out.back().push_back(Action::parse(r.substr(at, end == std::string::npos ? std::string::npos : end - at)));
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  return out;
}

// The textbook orders (PyTorch's ScheduleGPipe/Schedule1F1B, Megatron-LM's interleaved
// schedule), written out by hand for pp = 2, so the generator is checked against an order
// derived independently of its code.
TEST(PipelineScheduleTest, TheOrdersAreTheTextbookOnes) {
  const Order gpipe = schedule(ScheduleKind::kGPipe, {2, 1, 4});
  EXPECT_EQ(texts(gpipe[0]), "F0.0 F0.1 F0.2 F0.3 B0.0 B0.1 B0.2 B0.3");
  EXPECT_EQ(texts(gpipe[1]), "F1.0 F1.1 F1.2 F1.3 B1.0 B1.1 B1.2 B1.3");
  const Order one = schedule(ScheduleKind::k1F1B, {2, 1, 4});
  EXPECT_EQ(texts(one[0]), "F0.0 F0.1 B0.0 F0.2 B0.1 F0.3 B0.2 B0.3");
  EXPECT_EQ(texts(one[1]), "F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3");
  // pp 2, vpp 2: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3; micro-batches in pairs.
  const Order inter = schedule(ScheduleKind::kInterleaved1F1B, {2, 2, 4});
  EXPECT_EQ(texts(inter[0]), "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3");
  EXPECT_EQ(texts(inter[1]), "F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3");
}

TEST(PipelineScheduleTest, EveryGeneratedOrderIsAValidStep) {
  int checked = 0;
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B}) {
    for (int pp = 1; pp <= 4; ++pp) {
      for (int vpp = 1; vpp <= 3; ++vpp) {
        for (int m = 1; m <= 8; ++m) {
          const PipelineShape shape{pp, vpp, m};
          try {
            validate(kind, shape);
          } catch (const Error&) {
            continue;
          }
          const Order order = schedule(kind, shape);
          EXPECT_EQ(all(order_problems(kind, shape, order)), "")
              << schedule_name(kind) << " pp " << pp << " vpp " << vpp << " m " << m;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 60);
}

// 1F1B holds pp - rank micro-batches' activations, GPipe all of them: the difference that is
// the reason to run 1F1B, checked as part of "is this the schedule's order".
TEST(PipelineScheduleTest, InFlightActivationsAreTheSchedulesBound) {
  const PipelineShape shape{4, 1, 8};
  EXPECT_EQ(max_in_flight(ScheduleKind::kGPipe, shape, 0), 8);
  EXPECT_EQ(max_in_flight(ScheduleKind::k1F1B, shape, 0), 4);
  EXPECT_EQ(max_in_flight(ScheduleKind::k1F1B, shape, 3), 1);
  const auto problems = order_problems(ScheduleKind::k1F1B, shape, schedule(ScheduleKind::kGPipe, shape));
  EXPECT_THAT(all(problems), HasSubstr("rank 0 held the activations of 8 forwards at once; 1f1b holds at most 4"));
}

TEST(PipelineScheduleTest, EachPlantedScheduleBugIsNamed) {
  const PipelineShape shape{2, 1, 2};
  const ScheduleKind k = ScheduleKind::k1F1B;
  ASSERT_EQ(all(order_problems(k, shape, parse({"F0.0 F0.1 B0.0 B0.1", "F1.0 B1.0 F1.1 B1.1"}))), "");
  // A micro-batch's backward dropped on the last stage (its gradient never reaches stage 0).
  EXPECT_THAT(all(order_problems(k, shape, parse({"F0.0 F0.1 B0.0 B0.1", "F1.0 B1.0 F1.1"}))),
              HasSubstr("B1.1 never ran"));
  // A forward run twice (a micro-batch's activation sent twice, the next one never).
  EXPECT_THAT(all(order_problems(k, shape, parse({"F0.0 F0.0 B0.0 B0.1", "F1.0 B1.0 F1.1 B1.1"}))),
              HasSubstr("F0.0 ran 2 times"));
  // A stage on the wrong rank.
  EXPECT_THAT(all(order_problems(k, shape, parse({"F0.0 F0.1 B0.0 B0.1 F1.0", "B1.0 F1.1 B1.1"}))),
              HasSubstr("rank 0 ran F1.0, but stage 1 lives on rank 1"));
  // A backward before its own forward.
  EXPECT_THAT(all(order_problems(k, shape, parse({"F0.0 F0.1 B0.0 B0.1", "B1.0 F1.0 F1.1 B1.1"}))),
              HasSubstr("rank 1 ran B1.0 before its forward F1.0"));
  // Every action once and each forward before its backward, yet the ranks wait on each other:
  // rank 0 waits for B1.0 before it sends F0.1, rank 1 for F0.1's activation before B1.0.
  EXPECT_THAT(all(order_problems(k, shape, parse({"F0.0 B0.0 F0.1 B0.1", "F1.0 F1.1 B1.0 B1.1"}))),
              HasSubstr("deadlock): rank 0 waits at B0.0 for B1.0; rank 1 waits at F1.1 for F0.1"));
  // The wrong number of ranks.
  EXPECT_THAT(all(order_problems(k, shape, parse({"F0.0 F0.1 B0.0 B0.1"}))), HasSubstr("names 1 pp rank(s)"));
}

TEST(PipelineScheduleTest, ShapesAndLayerSplitsShowTheArithmetic) {
  EXPECT_THAT([] { (void)stage_layers(3, {2, 2, 4}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("pp(2) x vpp(2) = 4 stages do not divide 3 layers")));
  const auto split = stage_layers(8, {2, 2, 4});
  ASSERT_EQ(split.size(), 4u);
  EXPECT_EQ(split[1], (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ((PipelineShape{2, 2, 4}.stages_of(1)), (std::vector<int>{1, 3}));
  EXPECT_THAT([] { validate(ScheduleKind::kInterleaved1F1B, {2, 2, 3}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("micro_batches(3) is not a multiple of pp(2)")));
  EXPECT_THAT([] { validate(ScheduleKind::k1F1B, {2, 2, 4}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("use interleaved_1f1b")));
  EXPECT_THAT([] { (void)parse_schedule("zero_bubble"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("expected gpipe, 1f1b or interleaved_1f1b")));
  EXPECT_EQ(parse_schedule(schedule_name(ScheduleKind::kInterleaved1F1B)), ScheduleKind::kInterleaved1F1B);
  for (const char* bad : {"X0.1", "F0", "F0.-1", "F.1", "F0.1x", ""}) {
    EXPECT_THROW((void)Action::parse(bad), Error) << bad;
  }
  EXPECT_EQ(Action::parse("B12.3"), (Action{Action::Kind::kBackward, 12, 3}));
  // p2p bytes: 3 boundaries x 4 micro-batches x 2 directions x 1 KiB.
  EXPECT_EQ(p2p_bytes_per_step({4, 1, 4}, 1024), 3 * 4 * 2 * 1024);
}

}  // namespace
}  // namespace mih::pp
