// Goldens of the original model (docs/golden.md; the MatchesOriginal suite): what a golden
// producer (golden/mih_golden.py, run by `mih golden`) computed from the ORIGINAL architecture
// on a `mih export` of the port: the loss, the logits, the hidden state after every decoder
// layer and after the final norm, every parameter's gradient under its external key, and the
// parameters after one optimizer step. Here: reading and checking a golden directory, refusing
// one that does not belong to the run (another checkpoint, batch or trainer options; a format
// version this mih does not read), and comparing a case's evidence at step 0 with it, each
// quantity through the spec's layer map and key map, at tolerances calibrated from the
// golden's own reduction-order noise (or the lane's, for a reduced-precision reference).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/cases/registrations.h"
#include "harness/compare/compare.h"
#include "harness/compare/verdicts.h"
#include "harness/spec/model_spec.h"

namespace mih::cases {

/// The golden format this mih reads: golden.json's "format" and "version".
inline constexpr const char* kGoldenFormat = "mih-golden";
inline constexpr int64_t kGoldenVersion = 1;

/// A golden directory, its manifest checked.
struct Golden {
  std::filesystem::path dir;
  /// golden.json as read.
  nlohmann::json manifest;
  /// "builtin 1 (llama; torch 1.13.1)": what computed it.
  std::string implementation;
  /// The spec of the export it was computed from ("" when the export named none).
  std::string spec;
  /// Decoder layers L: hidden states 0 .. L + 1.
  int64_t num_hidden_layers = 0;
  /// The epsilon of the lowest precision the implementation rounds to (float64's for the
  /// builtin; float32's for transformers' Llama family, which casts its norms to float32):
  /// the floor of every tolerance.
  double compute_epsilon = 0;
  /// SHA-256 of what it was computed from and of its own tensors file.
  std::string checkpoint_sha256, batch_sha256, training_sha256, tensors_sha256;
  /// Golden tensor name -> its relative error between the producer's run and its noise twin
  /// (another reduction order); empty when the producer measured none.
  std::map<std::string, double> noise;
  std::filesystem::path tensors_file() const;
};

/// Reads and checks `dir`/golden.json and its tensors file.
/// Throws: mih::Error{kFailedPrecondition} when `dir` or golden.json does not exist (naming
///   `mih golden`, which writes one); kInvalidSpec when golden.json is not JSON, its "format"
///   is not kGoldenFormat, its "version" is not one this mih reads (naming both versions), a
///   field is missing or malformed, or the tensors file is missing or its SHA-256 is not the
///   manifest's (a stale or edited golden), naming the file and both digests.
Golden read_golden(const std::filesystem::path& dir);

/// SHA-256 of what `mih export --dtype float64` of `spec` (parameter seed `seed`, weights from
/// `init_from` when not empty) writes: its checkpoint (checkpoint_digest), batch.safetensors
/// and training.json. Exports into a scratch directory under the system's temp dir, then
/// removes it. Throws: as export_hf.
struct ExportDigests {
  std::string checkpoint_sha256, batch_sha256, training_sha256;
  /// What the export started from (the fix a refusal names: `mih golden` of the same start).
  uint64_t seed = 0;
  std::filesystem::path init_from;
};
ExportDigests export_digests(const spec::ModelSpec& spec, uint64_t seed, const std::filesystem::path& init_from);

/// Refuses a golden that was not computed from this run's export of `spec`: its spec name
/// (when it names one), then its checkpoint, batch and training hashes against `now`, and the
/// spec's layer map against its hidden states (indices 0 .. L + 1).
/// Throws: mih::Error{kInvalidSpec} naming the golden, the hash that differs (the golden's and
///   this run's, and what each covers) and the fix (`mih golden --spec S --out DIR`).
void check_golden_matches(const spec::ModelSpec& spec, const Golden& golden, const ExportDigests& now);

/// One comparison of a case's step 0 with a golden.
struct GoldenComparison {
  /// Every compared quantity as compare_evidence keys it (metric loss; activation forward_output
  /// of each mapped module and the logits module; tensor grad_before_clip and after_optimizer of
  /// each parameter), and the divergences beyond tolerance, in forward order.
  Comparison comparison;
  /// Measurement::key() -> the golden tensors it was compared with ("hidden_states.1",
  /// "grad.model.layers.0.mlp.gate_proj.weight, grad.model.layers.0.mlp.up_proj.weight").
  std::map<std::string, std::string> golden_names;
  /// compare/golden.json: the golden, the rule, per quantity its error, noise, tolerance and
  /// error / tolerance; the largest error / tolerance and where; per kind the largest
  /// relative error.
  nlohmann::json evidence;
};

/// Compares the case `ev` (a world-size-1 reference: Reference, or a reduced lane's
/// LaneReference) at step 0 with `golden`: its loss (cases/runtime/metrics.jsonl), the
/// forward outputs of the modules of spec.golden.layers and spec.golden.logits, and every
/// watched parameter's gradient before clipping and value after the optimizer
/// (probes/rank0.jsonl), each rebuilt from the golden's external tensors through the spec's
/// key map (KeyMap::from_external) and reduced to the probes' statistics. A quantity one side
/// lacks is a divergence naming the side. Tolerances: `lane` when given (a reduced lane's
/// calibration), else calibrated from the golden's noise with the spec's noise_k,
/// noise_k_update and noise_floor_eps at the golden's compute_epsilon.
/// Throws: mih::Error as CaseEvidence (a missing evidence file), safetensors::Reader and
///   KeyMap::from_external (a golden tensor of another shape).
GoldenComparison compare_with_golden(const spec::ModelSpec& spec, const Golden& golden,
                                     const verdicts::CaseEvidence& ev, const Calibration* lane = nullptr);

/// The golden tensor names a quantity kind covers: "loss" (the loss and the logits),
/// "hidden_states", "gradients", "step" (the parameters after the optimizer step).
enum class GoldenQuantity { kLossAndLogits, kHiddenStates, kGradients, kStep };

/// The MatchesOriginal verdict of `quantity`: fails on its first divergence with the
/// localization over the whole comparison ("localized to '<module>': ..."), the divergence
/// (error, tolerance, the golden tensor and the files to open) and how many others; passes
/// with what it compared and the largest error / tolerance. A kind with nothing to compare
/// (no layer map, no logits module) fails: the suite is instantiated only where it has
/// something to check.
verdicts::Verdict golden_verdict(const GoldenComparison& c, GoldenQuantity quantity, const Golden& golden,
                                 const verdicts::CaseEvidence& ev);

/// Resolves the golden of every spec the run selects before any test runs: each `--golden
/// DIR` (RunOptions::golden_dirs) for the spec its golden.json names (or the run's one spec),
/// else the spec's own GoldenSpec::dir. Each is read (read_golden) and returned (spec name
/// -> golden directory; ConformanceRun::golden); then each spec for which `compared(spec)` is true (the run selects a
/// MatchesOriginal test of it: a scratch export costs a model build) is checked against this
/// run's export (export_digests with the seed of the spec's Reference case and its init
/// source; check_golden_matches). The spec's own golden (not a --golden) of another start
/// than the run's (--init-from, --seed: its checkpoint_sha256 differs) is dropped instead:
/// the run has no golden of that spec (its directory is returned as ""), so MatchesOriginal is
/// not instantiated on it (said on the progress line). A listing passes a predicate that is always false.
/// Throws: as read_golden, export_digests and check_golden_matches; kInvalidSpec for a
///   --golden of a spec the run does not select, two goldens of one spec, a golden.json that
///   names no spec when the run selects several, or a spec with a golden and no layer map.
/// Under RunOptions::no_golden nothing is read: every selected spec's golden is "" (said on the
/// progress line), and golden_dirs beside it is kInvalidSpec.
std::map<std::string, std::filesystem::path> resolve_goldens(const RunOptions& o,
                                                             const std::function<bool(const std::string& spec)>& compared);

}  // namespace mih::cases
