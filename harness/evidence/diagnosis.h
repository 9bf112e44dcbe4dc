// The diagnosis of a run across its matrix: which cases fail, which pass, and the features of
// their resolved configurations that separate them ("fails only with ep > 1; EP=1 controls
// pass"), with the smallest failing/passing pair to rerun. `mih test` prints it above
// GoogleTest's list of failures, every report format shows it, `mih faults` checks it per
// fault of the catalog. No torch.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/base/parallel_config.h"

namespace mih {

struct RunResults;

/// One case as the diagnosis sees it: its resolved configuration and its verdict.
struct DiagnosisCase {
  enum class Verdict { kPassed, kFailed, kNone };
  std::string spec;            ///< "moe"
  std::string name;            ///< "DpShard2Ep2"
  std::string kind = "train";  ///< "reference", "train", "resume" or "cross_resume" (spec::case_kind_name)
  ParallelConfig config;       ///< what it trains under (a resume: after the load)
  std::optional<ParallelConfig> save_config;  ///< a resume's config before the save
  /// kPassed: every test of the case passed; kFailed: one failed; kNone: no verdict (the case
  /// did not run to the end: an infrastructure or environment failure, bad input, no tests),
  /// left out of the diagnosis and listed with `no_verdict`.
  Verdict verdict = Verdict::kNone;
  std::string no_verdict;  ///< kNone: why ("transport_failure")
  std::set<std::string> failed_suites, passed_suites;  ///< "NumericParity"
  /// What reruns it: `mih run --spec <spec> --case <name> [--matrix <matrix>] [--fault <fault>]
  /// [--init-from <init_from>] [--training-backend <training_backend>]`; an empty field is left
  /// out (mih run's matrix is cpu-smoke, its backend "trainer").
  std::string matrix, fault, init_from, training_backend;
  /// Its MIH_CONFORMANCE_SUITES registration ("Moe"), for the `mih test` of a pair; "" unknown.
  std::string prefix;
  /// It ran with `fault` but never reached the fault's code (a catalog contrast): it ran the
  /// correct code, so its rerun command leaves --fault out.
  bool fault_not_reached = false;
  /// Where it diverges from the original model when it fails MatchesOriginal or ModuleParity:
  /// the localization of its failure ("localized to 'layers.0': its forward output is the first
  /// to diverge ..."), else the failure's first line; "" otherwise.
  std::string original_divergence;
  /// The spec's attention key/value heads (ModelSpec::num_key_value_heads, spec.resolved.json);
  /// 0 when the spec does not declare them. Gives the feature "tp > num_key_value_heads".
  int64_t num_key_value_heads = 0;

  std::string id() const { return spec + "/" + name; }
};

/// The suites that compare a case's numbers or inputs with the Reference (the others judge
/// findings of the case itself): NumericParity, InputIdentity.
const std::set<std::string>& reference_compared_suites();

/// The suites that compare a case with something else: the Reference-compared ones, and the
/// comparisons with the original model (MatchesOriginal, ModuleParity). A case on which none
/// ran compared nothing: its pass is never a control of a diagnosis.
const std::set<std::string>& comparison_suites();

/// The suites that compare the port with the original model: MatchesOriginal (the golden),
/// ModuleParity (independent implementations of its modules). One failing on the Reference
/// means the port does not compute the original model, in every configuration.
const std::set<std::string>& original_model_suites();

/// The first words of a kOriginalModel diagnosis.
inline constexpr char kNotTheOriginalModel[] = "the port does not compute the original model";

/// What the diagnosis found.
struct Diagnosis {
  enum class Kind {
    kNoFailure,     ///< no case with a verdict failed: nothing to say
    kEveryCase,     ///< every case with a verdict fails: no feature separates them
    kEveryParallel, ///< every case with world size > 1 fails and only world-size-1 cases pass
    kSeparated,     ///< a feature, or a pair, holds for every failing case and for no passing one
    kMostly,        ///< one does, but for a few exceptions (at most 1 in 5 cases)
    kInconclusive,  ///< no feature or pair of features separates them
    /// the Reference fails MatchesOriginal or ModuleParity and nothing else, or every failing case
    /// fails MatchesOriginal and nothing else: the port computes another model than the original
    /// the same way in every configuration (feature "original_model"); said first, the other
    /// failing cases its possible consequences, no axis blamed, no pair
    kOriginalModel,
  };
  Kind kind = Kind::kNoFailure;
  /// The explanation's literals as feature keys ("ep>1"; "!sp" for "without sequence
  /// parallelism"); kEveryCase: {"every_case"}; kEveryParallel: {"world_size>1"};
  /// kOriginalModel: {"original_model"}.
  std::vector<std::string> features;
  std::string explanation;  ///< in words: "ep > 1", "tp > 1 without sequence parallelism"
  /// Other features that hold for exactly the same cases here: the run cannot tell them from
  /// the explanation (a case with one and not the other would).
  std::vector<std::string> indistinguishable;
  std::vector<std::string> failing, passing, no_verdict;  ///< "spec/case" ("spec/case (why)" for no_verdict)
  std::vector<std::string> exceptions;  ///< kMostly: "spec/case fails without it", "spec/case passes with it"
  /// Passing cases that differ from a failing one only in the explanation's features.
  std::vector<std::string> controls;
  std::string controls_phrase;  ///< "EP=1 controls", "controls without sequence parallelism"
  /// Passing cases on which no comparison suite ran (comparison_suites()): they compared
  /// nothing, so they are never controls nor the passing half of the pair.
  std::vector<std::string> compared_nothing;
  /// kOriginalModel: the cases failing MatchesOriginal or ModuleParity with where they diverge
  /// first ("llama/Reference fails MatchesOriginal: localized to 'layers.0': ...").
  std::vector<std::string> original;
  /// kOriginalModel: the other failing cases, its possible consequences (no axis is blamed).
  /// Under another kind: the same for the specs whose Reference is not the original, said
  /// first; the kind and the rest describe the other specs' cases alone.
  std::vector<std::string> consequences;
  /// The original's suites that fail ("MatchesOriginal", "ModuleParity").
  std::set<std::string> original_suites;
  /// The failing cases fail only suites that compare with the Reference, and pass a suite
  /// that judges their own findings.
  bool reference_compared_only = false;
  /// The smallest pair to rerun: a failing case and the passing case closest to it (fewest
  /// differing features, then fewest ranks).
  struct Pair {
    std::string failing, passing;                  ///< "spec/case"
    std::string failing_command, passing_command;  ///< `mih run ...`
    std::vector<std::string> differences;          ///< the features that differ, in words
    bool passing_fault_not_reached = false;        ///< the passing one never reached its fault
    /// `mih test` of both cases (their Reference launched with them): both verdicts in one
    /// command; "" when the two were run differently (another matrix, checkpoint, backend).
    std::string test_command;
  };
  std::optional<Pair> pair;

  /// The diagnosis in a few lines, the summary first; none for kNoFailure.
  std::vector<std::string> lines() const;
  /// The summary line alone ("" for kNoFailure): table_summary(), led by "the port does not
  /// compute the original model: ..." when some spec's Reference is not the original and
  /// another spec's cases fail besides.
  std::string summary() const;
  /// What `kind` says of the table it was computed on.
  std::string table_summary() const;
  /// Every field; "kind" as "no_failure", "every_case", "every_parallel", "separated",
  /// "mostly", "inconclusive", "original_model".
  nlohmann::json to_json() const;
};

std::string diagnosis_kind_name(Diagnosis::Kind kind);

/// Reads the whole table. First the original model: when a Reference fails MatchesOriginal or
/// ModuleParity and nothing else (or every failing case fails MatchesOriginal alone),
/// kOriginalModel says "the port does not compute the original model" with where it diverges, and
/// the other failing cases are its possible consequences, never an axis's. The features of a case's
/// configuration: each mesh axis > 1, an axis's degree where the table has several degrees > 1 of
/// it ("tp = 4"), tp > num_key_value_heads (a spec that declares them), ep > 1, edp > 1 (ep > 1
/// with the experts also FSDP-sharded: dp_shard * cp / ep > 1), sequence parallelism, the zigzag or
/// contiguous cp layout, activation checkpointing, micro_batches > 1, a resume (on the same
/// topology, across topologies), the noise twin, the dtype and the spec where the table has
/// several, more than 2 ranks, world size > 1 (a resume has the features of both its
/// configurations). The candidates: each feature, then each conjunction of two features of
/// different families, or of a feature and the absence of another ("tp > 1 without sequence
/// parallelism"; never an absence alone, nor of a world size). The explanation is the candidate
/// with the fewest exceptions (failing cases where it is false, passing ones where it is true),
/// then the fewest literals, positive before negative, then in that order of features (an axis's
/// degree after the others, before the world size, and alone: "tp = 4" only where "tp > 1" does not
/// do as well). A passing case that compared nothing (no comparison suite ran on it) is never a
/// control nor the pair's passing half. It refuses to over-claim: a single failing case is said to
/// be one case ("the only one with ..."); when world size > 1 alone explains it, "every parallel
/// case fails", with the features the run cannot tell from it; other features true on exactly the
/// same cases are named as indistinguishable; exceptions are accepted only in a table of at least 5
/// cases, at most 1 in 5, and otherwise it says that nothing separates them. Every case failing is
/// kEveryCase ("the Reference included": not a parallel bug).
Diagnosis diagnose(const std::vector<DiagnosisCase>& cases);

/// The cases of a run root as read_run_results read them: verdicts from their tests (a case
/// whose outcome is not "ran", or that has no run/case.json to say its configuration, has no
/// verdict), configurations from run/case.json, the rerun command from case_run.json, the
/// spec's num_key_value_heads from spec.resolved.json, where it diverges from the original
/// model from its failed MatchesOriginal (HiddenStatesMatchOriginal first) or ModuleParity test.
std::vector<DiagnosisCase> diagnosis_cases(const RunResults& run);

/// `mih run --spec S --case C [--matrix M] [--fault F] [--init-from D]`, each value quoted for a
/// POSIX shell where it needs it.
std::string rerun_command(const DiagnosisCase& c, bool with_fault = true);

}  // namespace mih
