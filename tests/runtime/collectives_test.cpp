// Every collective of Communicator (and so of harness/compat) on 2 and 4 thread ranks, on
// each axis of a 1x2 and a 2x2 mesh, for float32, float64, bfloat16 and int64, against
// closed-form expected values; plus the error paths (bad shapes, a missing peer, a dead peer).
#include <atomic>
#include <future>
#include <ostream>
#include <thread>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/runtime/device_mesh.h"
#include "harness/runtime/dtypes.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::HasSubstr;

struct AxisCase {
  const char* mesh;
  MeshAxis axis;
};

std::ostream& operator<<(std::ostream& out, const AxisCase& c) {
  return out << "mesh " << c.mesh << ", axis " << mesh_axis_name(c.axis);
}

std::string case_name(const ::testing::TestParamInfo<AxisCase>& info) {
  std::string out;
  bool upper = true;
  for (char ch : std::string(info.param.mesh) + "_on_" + std::string(mesh_axis_name(info.param.axis))) {
    if (ch == '_' || ch == ',' || ch == '=') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
    upper = false;
  }
  return out;
}

const at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong};

// x[i] = (global_rank + 1) * (i % 5 + 1): small integers, exact in every dtype.
at::Tensor input_of(int global_rank, int64_t numel, int64_t offset, at::ScalarType dtype) {
  at::Tensor i = at::arange(offset, offset + numel, at::kLong);
  return ((i.remainder(5) + 1) * (global_rank + 1)).to(dtype);
}

at::Tensor weights(int64_t numel, int64_t offset) {
  return (at::arange(offset, offset + numel, at::kLong).remainder(5) + 1).to(at::kDouble);
}

::testing::AssertionResult Matches(const at::Tensor& actual, const at::Tensor& expected, double tolerance = 0) {
  at::Tensor a = actual.to(at::kDouble).reshape(-1);
  at::Tensor e = expected.to(at::kDouble).reshape(-1);
  if (a.numel() != e.numel()) {
    return ::testing::AssertionFailure() << "numel " << a.numel() << " != expected " << e.numel();
  }
  at::Tensor diff = (a - e).abs();
  int64_t worst = diff.argmax().item<int64_t>();
  double err = diff[worst].item<double>();
  if (err <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs error " << err << " at index " << worst << ": expected "
                                       << e[worst].item<double>() << ", got " << a[worst].item<double>()
                                       << " (tolerance " << tolerance << ")";
}

class CollectiveTest : public ::testing::TestWithParam<AxisCase> {
 protected:
  // Runs `body(comm)` for each dtype on every rank of the case's mesh.
  void RunOnAxis(const std::function<void(Communicator&, at::ScalarType)>& body) {
    auto errors = testing::run_mesh(ParallelConfig::parse_mesh(GetParam().mesh), [&](DeviceMesh& mesh) {
      for (at::ScalarType dtype : kDtypes) {
        SCOPED_TRACE(::testing::Message() << "rank " << mesh.rank() << ", dtype " << dtype);
        body(mesh.comm(GetParam().axis), dtype);
      }
    });
    EXPECT_THAT(errors, ::testing::IsEmpty());
  }
};

TEST_P(CollectiveTest, AllReduceSumAvgMaxMin) {
  RunOnAxis([](Communicator& comm, at::ScalarType dtype) {
    const int64_t numel = 12;
    const int me = comm.ranks()[comm.rank()];
    double sum = 0, hi = 0, lo = 1e9;
    for (int g : comm.ranks()) {
      sum += g + 1;
      hi = std::max(hi, g + 1.0);
      lo = std::min(lo, g + 1.0);
    }
    const bool integral = dtype == at::kLong;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      at::Tensor t = input_of(me, numel, 0, dtype);
      comm.all_reduce(t, op);
      at::Tensor w = weights(numel, 0);
      at::Tensor expected = op == ReduceOp::kSum   ? w * sum
                            : op == ReduceOp::kMax ? w * hi
                            : op == ReduceOp::kMin ? w * lo
                            : integral             ? at::trunc(w * sum / comm.size())
                                                   : w * sum / comm.size();
      double tol = op == ReduceOp::kAvg && dtype == at::kBFloat16 ? 0.0625 : 1e-6;
      EXPECT_TRUE(Matches(t, expected.to(dtype), tol)) << compat::reduce_op_name(op);
      EXPECT_EQ(t.scalar_type(), dtype);
    }
  });
}

TEST_P(CollectiveTest, AllReduceWritesBackIntoNonContiguousTensor) {
  RunOnAxis([](Communicator& comm, at::ScalarType dtype) {
    const int me = comm.ranks()[comm.rank()];
    at::Tensor base = input_of(me, 12, 0, dtype).reshape({3, 4});
    at::Tensor view = base.t();  // [4, 3], not contiguous
    ASSERT_FALSE(view.is_contiguous());
    comm.all_reduce(view, ReduceOp::kMax);
    double hi = 0;
    for (int g : comm.ranks()) hi = std::max(hi, g + 1.0);
    EXPECT_TRUE(Matches(base, (weights(12, 0) * hi).to(dtype)));
  });
}

TEST_P(CollectiveTest, AllGatherIntoTensorOrdersByAxisRank) {
  RunOnAxis([](Communicator& comm, at::ScalarType dtype) {
    const int me = comm.ranks()[comm.rank()];
    at::Tensor in = input_of(me, 6, 0, dtype).reshape({2, 3});
    at::Tensor out = at::empty({comm.size() * 2, 3}, in.options());
    comm.all_gather_into_tensor(out, in);
    std::vector<at::Tensor> parts;
    for (int g : comm.ranks()) parts.push_back(weights(6, 0) * (g + 1));
    EXPECT_TRUE(Matches(out, at::cat(parts)));
    // all_gather on a later dim: [2, 3] -> [2, 3 * size]
    at::Tensor cols = comm.all_gather(in, 1);
    ASSERT_EQ(cols.sizes(), (std::vector<int64_t>{2, 3 * comm.size()}));
    for (int j = 0; j < comm.size(); ++j) {
      EXPECT_TRUE(Matches(cols.narrow(1, 3 * j, 3), input_of(comm.ranks()[j], 6, 0, dtype).reshape({2, 3})));
    }
  });
}

TEST_P(CollectiveTest, ReduceScatterTensorKeepsOwnChunk) {
  RunOnAxis([](Communicator& comm, at::ScalarType dtype) {
    const int me = comm.ranks()[comm.rank()];
    const int64_t chunk = 4;
    double sum = 0;
    for (int g : comm.ranks()) sum += g + 1;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      at::Tensor in = input_of(me, comm.size() * chunk, 0, dtype);
      at::Tensor out = at::empty({chunk}, in.options());
      comm.reduce_scatter_tensor(out, in, op);
      at::Tensor expected = weights(chunk, comm.rank() * chunk) * sum;
      if (op == ReduceOp::kAvg) expected = expected / comm.size();
      if (op == ReduceOp::kAvg && dtype == at::kLong) expected = at::trunc(expected);
      double tol = op == ReduceOp::kAvg && dtype == at::kBFloat16 ? 0.0625 : 1e-6;
      EXPECT_TRUE(Matches(out, expected.to(dtype), tol)) << compat::reduce_op_name(op);
    }
  });
}

TEST_P(CollectiveTest, BroadcastFromEveryRoot) {
  RunOnAxis([](Communicator& comm, at::ScalarType dtype) {
    for (int root = 0; root < comm.size(); ++root) {
      at::Tensor t = input_of(comm.ranks()[comm.rank()], 5, 0, dtype);
      comm.broadcast(t, root);
      EXPECT_TRUE(Matches(t, input_of(comm.ranks()[root], 5, 0, dtype))) << "root " << root;
    }
  });
}

TEST_P(CollectiveTest, AllToAllSingleWithUnevenSplits) {
  RunOnAxis([](Communicator& comm, at::ScalarType dtype) {
    const int me = comm.rank(), n = comm.size();
    // Axis rank a sends a + b + 1 rows of value 10 * a + b to axis rank b.
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> blocks, expected;
    for (int b = 0; b < n; ++b) {
      in_splits.push_back(me + b + 1);
      out_splits.push_back(b + me + 1);
      blocks.push_back(at::full({me + b + 1, 2}, 10.0 * me + b, at::kDouble));
      expected.push_back(at::full({b + me + 1, 2}, 10.0 * b + me, at::kDouble));
    }
    at::Tensor in = at::cat(blocks).to(dtype);
    at::Tensor out = at::empty({at::cat(expected).size(0), 2}, in.options());
    comm.all_to_all_single(out, in, out_splits, in_splits);
    EXPECT_TRUE(Matches(out, at::cat(expected)));
  });
}

TEST_P(CollectiveTest, SendRecvAroundTheRing) {
  const ParallelConfig dims = ParallelConfig::parse_mesh(GetParam().mesh);
  if (MeshLayout(dims, dims.world_size()).group_ranks(GetParam().axis, 0).size() < 2) {
    GTEST_SKIP() << "point-to-point needs 2 ranks on axis '" << mesh_axis_name(GetParam().axis) << "'";
  }
  RunOnAxis([](Communicator& comm, at::ScalarType dtype) {
    const int n = comm.size(), me = comm.rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    at::Tensor out = input_of(comm.ranks()[me], 7, 0, dtype);
    at::Tensor in = at::zeros_like(out);
    comm.send_recv(out, next, in, prev);
    EXPECT_TRUE(Matches(in, input_of(comm.ranks()[prev], 7, 0, dtype)));
    // Blocking send/recv in an order that cannot deadlock: even axis ranks send first.
    at::Tensor back = at::zeros_like(out);
    if (me % 2 == 0) {
      comm.send(out, prev, /*tag=*/1);
      comm.recv(back, next, /*tag=*/1);
    } else {
      comm.recv(back, next, /*tag=*/1);
      comm.send(out, prev, /*tag=*/1);
    }
    EXPECT_TRUE(Matches(back, input_of(comm.ranks()[next], 7, 0, dtype)));
  });
}

TEST_P(CollectiveTest, EveryCallIsInTheLedger) {
  std::vector<std::shared_ptr<CommLedger>> ledgers;
  std::mutex mutex;
  const ParallelConfig dims = ParallelConfig::parse_mesh(GetParam().mesh);
  compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
  auto errors = testing::run_ranks(dims.world_size(), [&](int rank) {
    MeshOptions o;
    o.group = testing::thread_group_options();
    o.ledger = std::make_shared<CommLedger>();
    DeviceMesh mesh(dims, store, rank, dims.world_size(), o);
    at::Tensor t = at::ones({3, 5}, at::kDouble);
    mesh.comm(GetParam().axis).all_reduce(t, ReduceOp::kAvg, "ledger_test");
    mesh.comm(GetParam().axis).barrier();
    std::lock_guard<std::mutex> lock(mutex);
    ledgers.push_back(o.ledger);
  });
  ASSERT_THAT(errors, ::testing::IsEmpty());
  ASSERT_EQ(ledgers.size(), static_cast<size_t>(dims.world_size()));
  const bool one_rank_axis = MeshLayout(dims, dims.world_size()).group_ranks(GetParam().axis, 0).size() == 1;
  for (const auto& ledger : ledgers) {
    auto records = ledger->completed();
    ASSERT_EQ(records.size(), one_rank_axis ? 1u : 3u) << "calls on a 1-rank axis move nothing and are not recorded";
    EXPECT_EQ(records[0].op, "barrier");  // the end of mesh construction
    EXPECT_EQ(records[0].axis, "world");
    EXPECT_THAT(records[0].site, HasSubstr("mesh_built"));
    if (one_rank_axis) continue;
    records.erase(records.begin());
    EXPECT_EQ(records[0].axis, mesh_axis_name(GetParam().axis));
    EXPECT_EQ(records[0].op, "all_reduce.avg");
    EXPECT_EQ(records[0].dtype, "float64");
    EXPECT_EQ(records[0].numel, 15);
    EXPECT_EQ(records[0].bytes, 15 * 8);
    EXPECT_THAT(records[0].site, HasSubstr("ledger_test @ runtime/collectives_test.cpp:"));
    EXPECT_EQ(records[1].op, "barrier");
    EXPECT_FALSE(ledger->in_flight().has_value());
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, CollectiveTest,
                         ::testing::Values(AxisCase{"tp=2", MeshAxis::kWorld}, AxisCase{"tp=2", MeshAxis::kTp},
                                           AxisCase{"dp_shard=2,tp=2", MeshAxis::kWorld},
                                           AxisCase{"dp_shard=2,tp=2", MeshAxis::kDpShard},
                                           AxisCase{"dp_shard=2,tp=2", MeshAxis::kTp},
                                           AxisCase{"dp_shard=2,tp=2", MeshAxis::kCp}),
                         case_name);

TEST(DtypeNameTest, PythonNamesRoundTrip) {
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt, at::kBool}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t) << dtype_name(t);
  }
  EXPECT_EQ(dtype_name(at::kBFloat16), "bfloat16");
  EXPECT_THAT([] { parse_dtype("fp32"); }, ::testing::ThrowsMessage<Error>(HasSubstr("unknown dtype 'fp32'; valid: [float32")));
}

TEST(CollectiveErrorTest, MismatchedShapesAreInvalidSpec) {
  auto errors = testing::run_mesh(ParallelConfig::parse_mesh("tp=2"), [](DeviceMesh& mesh) {
    Communicator& tp = mesh.comm(MeshAxis::kTp);
    at::Tensor in = at::ones({3});
    at::Tensor too_small = at::empty({5});
    EXPECT_THAT([&] { tp.all_gather_into_tensor(too_small, in); },
                ::testing::ThrowsMessage<Error>(HasSubstr("output must hold size(2) * input.numel(3) = 6 elements, got 5")));
    EXPECT_THAT([&] { tp.reduce_scatter_tensor(too_small, in); },
                ::testing::ThrowsMessage<Error>(HasSubstr("input must hold size(2) * output.numel(5) = 10 elements")));
    at::Tensor out = at::empty({4});
    EXPECT_THAT([&] { tp.all_to_all_single(out, in, {2, 2}, {1, 1}); },
                ::testing::ThrowsMessage<Error>(HasSubstr("input_splits sum to 2 but dim 0 of input is 3")));
    EXPECT_THAT([&] { tp.broadcast(in, 2); }, ::testing::ThrowsMessage<Error>(HasSubstr("root 2 is not a group rank")));
    at::Tensor flags = at::ones({2}, at::kBool);
    EXPECT_THAT([&] { tp.all_reduce(flags, ReduceOp::kAvg); },
                ::testing::ThrowsMessage<Error>(HasSubstr("avg of a bool tensor is undefined")));
  });
  EXPECT_THAT(errors, ::testing::IsEmpty());
}

TEST(CollectiveErrorTest, BoolReductionsAreAnyAndAll) {
  auto errors = testing::run_mesh(ParallelConfig::parse_mesh("tp=2"), [](DeviceMesh& mesh) {
    Communicator& tp = mesh.comm(MeshAxis::kTp);
    // rank 0: [1, 0, 0], rank 1: [1, 1, 0]
    at::Tensor mine = tp.rank() == 0 ? at::tensor({1, 0, 0}) : at::tensor({1, 1, 0});
    at::Tensor any = mine.to(at::kBool), all = mine.to(at::kBool);
    tp.all_reduce(any, ReduceOp::kMax);
    tp.all_reduce(all, ReduceOp::kMin);
    EXPECT_TRUE(Matches(any, at::tensor({1, 1, 0})));
    EXPECT_TRUE(Matches(all, at::tensor({1, 0, 0})));
    EXPECT_EQ(any.scalar_type(), at::kBool);
  });
  EXPECT_THAT(errors, ::testing::IsEmpty());
}

// Rank 1 keeps its groups open but never enters the all_reduce: rank 0 must get a
// kDeadlineExceeded naming the op, the axis and the ranks, within the collective timeout.
TEST(CollectiveErrorTest, MissingPeerTimesOutNamingAxisOpAndRanks) {
  MeshOptions options;
  options.group = testing::thread_group_options(std::chrono::milliseconds(1500));
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  auto start = std::chrono::steady_clock::now();
  auto errors = testing::run_mesh(
      ParallelConfig::parse_mesh("tp=2"),
      [&](DeviceMesh& mesh) {
        if (mesh.rank() == 1) {
          done.wait();  // alive, but never calls
          return;
        }
        at::Tensor t = at::ones({4});
        try {
          mesh.comm(MeshAxis::kTp).all_reduce(t, ReduceOp::kSum, "lonely");
          ADD_FAILURE() << "all_reduce without its peer returned";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Code::kDeadlineExceeded) << e.what();
          EXPECT_THAT(e.what(), HasSubstr("all_reduce on group 'tp' (global ranks [0, 1]"));
          EXPECT_THAT(e.what(), HasSubstr("did not complete within 1500 ms"));
          EXPECT_THAT(e.what(), HasSubstr("on mesh axis 'tp', called from lonely @ runtime/collectives_test.cpp:"));
        }
        rank0_done.set_value();
      },
      options);
  EXPECT_THAT(errors, ::testing::IsEmpty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

// Rank 1 destroys its groups (as a dead process would close its sockets): rank 0's next
// collective is a transport failure, kUnavailable, not a timeout and not a wrong value.
TEST(CollectiveErrorTest, DeadPeerIsUnavailable) {
  const ParallelConfig dims = ParallelConfig::parse_mesh("tp=2");
  compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
  MeshOptions options;
  options.group = testing::thread_group_options(std::chrono::seconds(10));
  std::promise<void> rank1_gone;
  std::shared_future<void> gone = rank1_gone.get_future().share();
  auto errors = testing::run_ranks(2, [&](int rank) {
    {
      DeviceMesh mesh(dims, store, rank, 2, options);
      if (rank == 0) {
        gone.wait();
        at::Tensor t = at::ones({4});
        try {
          mesh.comm(MeshAxis::kTp).all_reduce(t);
          ADD_FAILURE() << "all_reduce with a dead peer returned";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Code::kUnavailable) << e.what();
          EXPECT_THAT(e.what(), HasSubstr("all_reduce on group 'tp' (global ranks [0, 1]"));
          EXPECT_THAT(e.what(), HasSubstr("a peer rank died or closed its connection"));
        }
        return;
      }
    }
    rank1_gone.set_value();
  });
  EXPECT_THAT(errors, ::testing::IsEmpty());
}

}  // namespace
}  // namespace mih
