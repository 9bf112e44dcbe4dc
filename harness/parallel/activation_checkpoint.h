// Activation checkpointing: run a region (e.g. one decoder layer) without keeping its
// activations and recompute it in backward (Chen et al. 2016, "Training Deep Nets with
// Sublinear Memory Cost"; PyTorch's torch.utils.checkpoint, reentrant variant). Implemented as
// one autograd Function whose inputs are the region's tensor inputs and its parameters, so the
// outer engine accumulates parameter gradients and every gradient hook fires
// (docs/spike-ac-cp.md section 1, option A). The recompute replays the forward's RNG state (CPU,
// and CUDA when the inputs are on CUDA) so dropout masks match, re-enters the forward's
// autocast state, and puts the current RNG state back afterwards.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace mih {

/// A region's forward: its tensor inputs in, one tensor out. Capture modules by value
/// (holders are shared pointers): the function lives as long as the autograd graph.
using RegionForward = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

/// Runs `forward(inputs)` without saving activations; backward recomputes it and returns the
/// gradients of `inputs` and `params`. `params` must list every leaf that requires grad the
/// region reads (its module's parameters, plus tied or shared ones; a tensor listed more than
/// once, as a module registered under two names, counts once: its first entry is kept);
/// `inputs` every non-parameter tensor that requires grad (activations, a learned table
/// computed outside).
/// Tensors that need no grad (masks, rotary tables) may be captured, if never modified in
/// place; pass them in `inputs` to have their version checked.
/// After the recompute the region's graph is walked: a leaf that requires grad and is not in
/// `params`, or an autograd node created before the recompute (a non-leaf captured from
/// outside), would silently lose its gradient, so either throws.
/// Throws (from backward): mih::Error{kInvalidSpec} naming the region for an undeclared leaf,
///   a captured non-leaf, an input modified in place since forward, or create_graph (double
///   backward through a checkpoint is not supported).
/// `generators`: generators besides the default CPU (and CUDA) one that the region draws from
/// (a model's own dropout generators); their state is replayed and restored likewise.
at::Tensor checkpoint(const std::string& region, const RegionForward& forward, const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& params, const std::vector<at::Generator>& generators = {});

/// True while the calling thread recomputes a checkpointed region in backward: what a
/// shared-state tracer records so a republish during recompute is told apart from a second
/// forward.
bool in_recompute();

/// The region being recomputed on the calling thread ("" when none).
const std::string& recompute_region();

}  // namespace mih
