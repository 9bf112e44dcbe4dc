// Pipeline schedules as data (issue 37): which stage each pipeline rank runs, which decoder
// layers each stage owns, the order in which each rank runs the forwards and backwards of a
// step's micro-batches (GPipe, 1F1B, interleaved 1F1B), and the check that an executed order
// is a valid one. The order is what harness/parallel/pipeline.h executes and what the
// evidence records; order_problems re-derives validity from the order alone (every action
// once, each forward before its backward, the point-to-point dependencies satisfiable, the
// schedule's bound on activations in flight), never from the generator that produced it.
// Torch-free.
//
// Vocabulary (PyTorch's torch.distributed.pipelining, Megatron-LM): pp ranks, vpp virtual
// stages per rank, stages = pp * vpp numbered 0..stages-1 in model order; stage s lives on pp
// rank s % pp (the "loop" placement of interleaved 1F1B: rank r holds stages r, r + pp, ...).
// A micro-batch's forward runs through stages 0..stages-1, its backward back from the last.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mih::pp {

/// The schedules. kGPipe: every forward, then every backward (m micro-batches' activations
/// held at once). k1F1B: pp - r - 1 warm-up forwards on rank r, then one forward and one
/// backward in turn, then the remaining backwards (at most pp - r in flight). kInterleaved1F1B:
/// 1F1B over vpp >= 2 virtual stages per rank, micro-batches taken in groups of pp (Megatron-LM's
/// interleaved schedule).
enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B };
/// "gpipe", "1f1b", "interleaved_1f1b".
std::string schedule_name(ScheduleKind kind);
/// Throws: mih::Error{kInvalidSpec} listing the valid names.
ScheduleKind parse_schedule(std::string_view name);

/// The pipeline of one step: pp ranks, vpp stages per rank, micro_batches per step.
struct PipelineShape {
  int pp = 1;
  int vpp = 1;
  int micro_batches = 1;
  int stages() const { return pp * vpp; }
  /// The pp rank stage `stage` lives on (stage % pp).
  int rank_of(int stage) const { return stage % pp; }
  /// The stages of pp rank `rank`, in model order: rank, rank + pp, ...
  std::vector<int> stages_of(int rank) const;
};

/// Throws: mih::Error{kInvalidSpec} with the arithmetic for a degree < 1, GPipe or 1F1B with
///   vpp != 1, interleaved 1F1B with vpp < 2 or micro_batches not a multiple of pp
///   ("interleaved 1F1B takes micro-batches in groups of pp: micro_batches(3) is not a
///   multiple of pp(2)").
void validate(ScheduleKind kind, const PipelineShape& shape);

/// The decoder layers of each stage, [first, last) in global layer index: contiguous and equal.
/// Throws: mih::Error{kInvalidSpec} with the arithmetic when the stages do not divide the
///   layers ("pp(2) x vpp(2) = 4 stages do not divide 3 layers").
std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t layers, const PipelineShape& shape);

/// One action of a pipeline rank: the forward or the backward of micro-batch `micro_batch`
/// through stage `stage`.
struct Action {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int stage = 0;
  int micro_batch = 0;
  /// "F1.3": the forward of micro-batch 3 through stage 1 ("B1.3" its backward).
  std::string text() const;
  /// Parses text(). Throws: mih::Error{kInvalidSpec} naming the text.
  static Action parse(std::string_view text);
  bool operator==(const Action&) const = default;
};

/// The order of actions of each pp rank (index: pp rank) for `kind` and `shape`.
/// Throws: as validate.
std::vector<std::vector<Action>> schedule(ScheduleKind kind, const PipelineShape& shape);

/// The most micro-batches rank `rank` of `kind` may hold activations of at once (forwards run
/// whose backward has not): GPipe micro_batches * vpp; 1F1B min(m, pp - rank);
/// interleaved min(m * vpp, (pp - rank - 1) * 2 + (vpp - 1) * pp + 1).
int max_in_flight(ScheduleKind kind, const PipelineShape& shape, int rank);

/// Why `executed` (per pp rank, the actions in the order that rank ran them) is not a valid
/// step of `kind` over `shape`, one line per problem; empty when it is. Checked from the order
/// alone: an action on the rank its stage does not live on; a forward or backward run twice
/// or never; a backward before its own forward on that rank; an order the ranks cannot run
/// (a forward needs the previous stage's forward of its micro-batch, a backward the next
/// stage's backward: sends are asynchronous, receives wait), reported with the action each
/// rank waits at; more micro-batches in flight on a rank than the schedule holds.
std::vector<std::string> order_problems(ScheduleKind kind, const PipelineShape& shape,
                                        const std::vector<std::vector<Action>>& executed);

/// Bytes a step moves over the pp axis: every micro-batch crosses each of the stages - 1
/// stage boundaries twice (its activation forward, that activation's gradient backward), so
/// 2 * (stages - 1) * micro_batches * `activation_bytes` (one micro-batch's activation at a
/// stage boundary, e.g. tokens x hidden x element size).
int64_t p2p_bytes_per_step(const PipelineShape& shape, int64_t activation_bytes);

}  // namespace mih::pp
