// The table of reduction paths (harness/base/reduction_paths.h): one row for every gradient
// layout and axis the runtime's rule reduces over, named and labelled consistently, and the
// smallest mesh of each path computed from that rule.
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/reduction_paths.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(ReductionPathsTest, OneRowPerGradientLayoutAndAxisTheRuleReducesOver) {
  std::set<std::string> names;
  for (const ReductionPath& p : reduction_paths()) {
    EXPECT_TRUE(names.insert(std::string(p.name)).second) << "duplicate path " << p.name;
    if (!p.per_parameter) continue;
    EXPECT_EQ(p.name, std::string(gradient_kind_name(p.kind)) + "." + std::string(gradient_layout_name(p.layout)) +
                          "." + std::string(p.axis));
    EXPECT_EQ(std::string(p.site), "grad_sync." + std::string(p.name));
  }
  // Every (kind, layout, axis) the runtime sums a gradient over has its row, and no other does:
  // tp for a tp-partial gradient, the FSDP reduce-scatter over the FSDP axis, the rule's all-reduces.
  for (GradientKind kind : {GradientKind::kDense, GradientKind::kExpert}) {
    for (GradientLayout layout : {GradientLayout::kUnsharded, GradientLayout::kFsdp}) {
      for (const char* axis : {"tp", "dp_replicate", "cp", "dp_shard", "edp"}) {
        const std::string fsdp_axis = kind == GradientKind::kExpert ? "edp" : "dp_shard";
        const bool scatter = layout == GradientLayout::kFsdp && axis == fsdp_axis;
        const bool exists = std::string(axis) == "tp" || scatter || all_reduced_over(kind, layout, axis);
        bool found = false;
        for (const ReductionPath& p : reduction_paths()) {
          if (p.per_parameter && p.kind == kind && p.layout == layout && p.axis == axis) {
            found = true;
            EXPECT_EQ(p.op, scatter ? "reduce_scatter.sum" : "all_reduce.sum") << p.name;
          }
        }
        EXPECT_EQ(found, exists) << gradient_kind_name(kind) << "." << gradient_layout_name(layout) << "." << axis;
        if (exists) {
          EXPECT_EQ(gradient_path(kind, layout, axis).axis, axis);
        }
      }
    }
  }
  EXPECT_THROW(gradient_path(GradientKind::kDense, GradientLayout::kUnsharded, "edp"), Error);
  EXPECT_THAT([] { reduction_path("dense.ddp"); },
              ThrowsMessage<Error>(HasSubstr("unknown reduction path 'dense.ddp'; paths: dense.unsharded.tp")));
}

TEST(ReductionPathsTest, SmallestMeshOfEachPath) {
  auto smallest = [](const char* name) { return smallest_mesh(reduction_path(name)); };
  EXPECT_EQ(smallest("dense.unsharded.dp_replicate").mesh_str(), "dp_replicate=2");  // plain DDP
  EXPECT_EQ(smallest("dense.fsdp.dp_replicate").mesh_str(), "dp_replicate=2,dp_shard=2");
  EXPECT_EQ(smallest("dense.unsharded.dp_shard").mesh_str(), "dp_shard=2");  // a parameter FSDP leaves whole
  EXPECT_EQ(smallest("dense.fsdp.cp").mesh_str(), "dp_shard=2,cp=2");
  EXPECT_EQ(smallest("expert.fsdp.edp").world_size(), 4);
  EXPECT_EQ(smallest("expert.unsharded.edp").world_size(), 4);
  // FSDP over edp needs edp = 2 beside ep = 2, and then a replica or tp on top: 8 ranks.
  EXPECT_EQ(smallest("expert.fsdp.dp_replicate").world_size(), 8);
  EXPECT_EQ(smallest("expert.fsdp.tp").world_size(), 8);
  EXPECT_EQ(smallest("grad_norm.world").world_size(), 2);
  EXPECT_EQ(smallest("loss.micro_batches").micro_batches, 2);
  for (const ReductionPath& p : reduction_paths()) {
    const ParallelConfig m = smallest_mesh(p);
    EXPECT_NO_THROW(m.validate_mesh(m.world_size())) << p.name;
    EXPECT_GT(axis_size(m, p.axis), 1) << p.name << " on " << m.mesh_str();
  }
  EXPECT_THAT([] { (void)axis_size(ParallelConfig(), "dp_rep"); }, ThrowsMessage<Error>(HasSubstr("unknown axis 'dp_rep'")));
}

}  // namespace
}  // namespace mih
