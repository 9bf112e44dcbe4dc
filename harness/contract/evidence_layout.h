// The evidence layout (DESIGN.md section 6) as code: the name of every file and directory mih
// writes or reads under a run root, a case directory, a launch's run directory, a golden or
// export directory and the `mih faults` output, so that every writer and every reader names a
// file through one constant or function here (as findings/codes.h does for finding codes).
// This comment is the one description of the tree. Torch-free: <filesystem> and <string> only.
//
// How to add a file: add one constant here (a path relative to the directory it lives in,
// named in this comment's tree and in one comment line beside it; a per-step, per-rank or
// per-phase file is a small function), then name it only through the constant in its writer
// and in its readers. tests/lint/evidence_paths.py fails on a path literal anywhere else in
// harness/ or suites/; tests under tests/ keep literals on purpose (they check the on-disk
// contract from outside).
//
//   <root>/                          a run root (--evidence-root)
//     results.jsonl                  one line per finished test, a start and an end line per process
//     run.json                       the run's matrix, registrations and init sources
//     <spec>/.<case>.lock            the case lock (one run of a case at a time over the root)
//     <spec>/<case>/                 a case directory (case_dir):
//       case_run.json                the parent's record: outcome, state, timing, digests
//       integration_state.json       the case's integration state and its reason
//       run/case.json                the resolved case every rank reads
//       run/<phase>/                 a launch's run directory per phase ("train", "save", "load"),
//                                    see "A launch's run directory" below, plus per rank r:
//         timing_rank<r>.json, fault_rank<r>.json, init_from_failed_rank<r>.json
//       environment.json, spec.resolved.json, config.resolved.json   (rank 0, the session)
//       check/{findings.json, structure.json, parameter_ownership.csv, fsdp_units.json,
//              fsdp_trace.json, frozen_parameters.json, optimizer_layout_initial.json,
//              activation_checkpoint.json (per step: what ran under checkpointing and what
//              backward recomputed), parameter_watchlist.json, invariants_<phase>.json,
//              loaded_values.json (weights set after the build), module_parity.json,
//              gradients_received.json (at finish: the trainable parameters no rank gave a
//              gradient at any step of the run)}
//       data/{field_ownership.json, batch_documents.json, observed_forward_fields.json,
//             token_losses.json, input_identity.jsonl}
//       checkpoint/                  the resume checkpoint (the backend's files), and
//         coverage.json, <event>_rank<r>.json, invariants_after_load.json,
//         optimizer_layout_after_load.json, roundtrip_load.json (roundtrip_save.json in before_save/)
//       cases/runtime/{metrics.jsonl, performance_rank<r>.jsonl, reduction_paths.json and per
//                      step k: shared_state_step<k>.json, modality_gradients_step<k>.json,
//                      optimizer_layout_step<k>.json, replicas_step<k>.json,
//                      gradient_presence_step<k>.json, tp_partial_gradients_step<k>.json,
//                      gradient_reductions_step<k>.json, invariants_step<k>.json,
//                      comm_expected_step<k>.json}
//       probes/rank0.jsonl           one line per stage and step; values are global, so rank 0
//                                    writes (forward_output and output_grad per observed module
//                                    at the first two steps and the last; model_before at the
//                                    first step; grad_after_clip and optimizer_state at the first
//                                    two and the last)
//       compare/{calibration.json, golden.json}   what the verdicts computed
//       before_save/                 a resume's save phase: a case directory of its own
//   The session (session.h) writes under SessionOptions::evidence_dir: rank 0 the shared files,
//   every rank its own *_rank<r> files.
//
//   <run dir>/                       a launch's run directory (mih launch, mih selftest, run/<phase>/)
//     .lock, store                   the launch's lock (its pid) and the FileStore of the rendezvous
//     run.json, selftest.json        mih launch's record and mih selftest's table
//     state_rank<r>.json             mih selftest's per-rank state
//     logs/{launcher.log, rank<r>.log, rank<r>.pid}
//     comm/ledger_rank<r>.jsonl      the communication ledger of rank r
//     errors/{rank<r>.json, rank_unknown.json}   a rank's uncaught error
//
//   <inspect out>/inventory/{candidate.json, reference.json, structure_diff.json,
//                           fingerprints.sha256}   mih inspect
//   <golden dir>/{golden.json, golden.safetensors}; <golden dir>/export/ (mih golden's export):
//     {mih_export.json, batch.safetensors, reference.safetensors, training.json, config.json}
//   <faults out>/{faults.json, faults.md, matrices/<spec>.json, fault-free/, contrast/,
//                 mih_test.log, mih_test_<round>.log, fault-free/mih_test_<spec>.log}
//   A Hugging Face checkpoint (read, and written by mih golden's export): config.json,
//     model.safetensors or model-*.safetensors with model.safetensors.index.json; a hub cache's
//     snapshots/<rev>/ with blobs/. A distributed checkpoint (the backend's checkpoint/):
//     index.json, rank<r>.safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace mih::layout {

// ---- The run root ------------------------------------------------------------------------
/// The default of every evidence directory, relative to where mih runs: mih-evidence/<run id>
/// (mih test), mih-evidence/manual (mih case), mih-evidence/inspect/<spec> (mih inspect),
/// mih-evidence/<run id> (mih launch, mih selftest).
inline constexpr char kDefaultEvidenceRoot[] = "mih-evidence";
inline constexpr char kManualDir[] = "manual";    ///< mih case's default root inside it
inline constexpr char kInspectDir[] = "inspect";  ///< mih inspect's default, inspect/<spec>
inline constexpr char kResults[] = "results.jsonl";  ///< one JSON line per finished test
inline constexpr char kRunRecord[] = "run.json";     ///< the run's matrix, registrations, init sources

/// <root>/<spec>/<case>.
std::filesystem::path case_dir(const std::filesystem::path& root, const std::string& spec, const std::string& case_name);
/// <root>/<spec>/.<case>.lock (cases::CaseLock).
std::filesystem::path case_lock(const std::filesystem::path& root, const std::string& spec, const std::string& case_name);

// ---- A case directory <root>/<spec>/<case>/ ----------------------------------------------
inline constexpr char kCaseRecord[] = "case_run.json";   ///< the parent's record: outcome, state, digests
inline constexpr char kRunDir[] = "run";                 ///< the launches' run directories
inline constexpr char kCaseRequest[] = "run/case.json";  ///< the resolved case every rank reads
inline constexpr char kEnvironment[] = "environment.json";
inline constexpr char kIntegrationState[] = "integration_state.json";
inline constexpr char kSpecResolved[] = "spec.resolved.json";
inline constexpr char kConfigResolved[] = "config.resolved.json";
/// A resume's save phase: a case directory of its own inside the case's.
inline constexpr char kBeforeSave[] = "before_save";
/// `relative` inside the save phase's directory: before_save/<relative>.
std::string before_save(const std::string& relative);

/// run/<phase>: the launch's run directory of one phase ("train", "save", "load").
std::string run_phase_dir(const std::string& phase);
inline constexpr char kTimingRankPrefix[] = "timing_rank";  ///< of run/<phase>/ files
inline constexpr char kFaultRankPrefix[] = "fault_rank";
inline constexpr char kInitFromFailedPrefix[] = "init_from_failed_rank";
/// timing_rank<r>.json in run/<phase>/: the rank's phase timing.
std::string timing_rank(int rank);
/// fault_rank<r>.json in run/<phase>/: whether the rank reached the injected fault.
std::string fault_rank(int rank);
/// init_from_failed_rank<r>.json in run/<phase>/: why --init-from could not load on rank r.
std::string init_from_failed_rank(int rank);

// check/
inline constexpr char kCheckDir[] = "check";
inline constexpr char kInvariantsPrefix[] = "invariants_";  ///< of check/ and cases/runtime/ files
inline constexpr char kFindings[] = "check/findings.json";
inline constexpr char kStructure[] = "check/structure.json";
inline constexpr char kParameterOwnership[] = "check/parameter_ownership.csv";
inline constexpr char kFsdpUnits[] = "check/fsdp_units.json";
inline constexpr char kFsdpTrace[] = "check/fsdp_trace.json";
inline constexpr char kFrozenParameters[] = "check/frozen_parameters.json";
inline constexpr char kOptimizerLayoutInitial[] = "check/optimizer_layout_initial.json";
inline constexpr char kActivationCheckpoint[] = "check/activation_checkpoint.json";
inline constexpr char kParameterWatchlist[] = "check/parameter_watchlist.json";
inline constexpr char kLoadedValues[] = "check/loaded_values.json";
inline constexpr char kModuleParity[] = "check/module_parity.json";
inline constexpr char kGradientsReceived[] = "check/gradients_received.json";
/// check/invariants_<phase>.json ("structure", "materialization").
std::string invariants(const std::string& phase);

// data/
inline constexpr char kFieldOwnership[] = "data/field_ownership.json";
inline constexpr char kBatchDocuments[] = "data/batch_documents.json";
inline constexpr char kObservedForwardFields[] = "data/observed_forward_fields.json";
inline constexpr char kTokenLosses[] = "data/token_losses.json";
inline constexpr char kInputIdentity[] = "data/input_identity.jsonl";

// checkpoint/
inline constexpr char kCheckpointDir[] = "checkpoint";  ///< the resume checkpoint's files
inline constexpr char kCheckpointCoverage[] = "checkpoint/coverage.json";
inline constexpr char kInvariantsAfterLoad[] = "checkpoint/invariants_after_load.json";
inline constexpr char kOptimizerLayoutAfterLoad[] = "checkpoint/optimizer_layout_after_load.json";
inline constexpr char kRoundtripLoad[] = "checkpoint/roundtrip_load.json";  ///< the load phase's hashes
inline constexpr char kRoundtripSave[] = "checkpoint/roundtrip_save.json";  ///< in before_save/
/// checkpoint/<event>_rank<r>.json: a checkpoint event ("save", "load") on rank r.
std::string checkpoint_event(const std::string& event, int rank);

// cases/runtime/
inline constexpr char kRuntimeDir[] = "cases/runtime";
inline constexpr char kMetrics[] = "cases/runtime/metrics.jsonl";  ///< one row per step (rank 0)
inline constexpr char kReductionPaths[] = "cases/runtime/reduction_paths.json";
/// cases/runtime/performance_rank<r>.jsonl.
std::string performance_rank(int rank);
/// cases/runtime/shared_state_step<k>.json.
std::string shared_state_step(int64_t step);
/// cases/runtime/modality_gradients_step<k>.json.
std::string modality_gradients_step(int64_t step);
/// cases/runtime/optimizer_layout_step<k>.json.
std::string optimizer_layout_step(int64_t step);
/// cases/runtime/replicas_step<k>.json.
std::string replicas_step(int64_t step);
/// cases/runtime/gradient_replicas_step<k>.json (TrainerSession: every rank's gradient piece
/// after the trainer's synchronization).
std::string gradient_replicas_step(int64_t step);
/// cases/runtime/gradient_presence_step<k>.json.
std::string gradient_presence_step(int64_t step);
/// cases/runtime/tp_partial_gradients_step<k>.json.
std::string tp_partial_gradients_step(int64_t step);
/// cases/runtime/gradient_reductions_step<k>.json.
std::string gradient_reductions_step(int64_t step);
/// cases/runtime/invariants_step<k>.json.
std::string invariants_step(int64_t step);
/// cases/runtime/comm_expected_step<k>.json.
std::string comm_expected_step(int64_t step);

// probes/, compare/
inline constexpr char kProbes[] = "probes/rank0.jsonl";
inline constexpr char kCalibration[] = "compare/calibration.json";
inline constexpr char kGoldenComparison[] = "compare/golden.json";

// ---- mih submit's records, under the evidence root (cli/submit_command.cpp) ----------------
inline constexpr char kSubmitDir[] = ".mih-submit";  ///< <root>/.mih-submit/<spec>/
/// .mih-submit/<spec>: the batch scripts and their logs (<case>.<phase>.<job id>.log).
std::string submit_dir(const std::string& spec);
/// .mih-submit/<spec>/jobs.json: {"<spec>/<case>:<phase>": "<job id>", ..., "<spec>:verify": ...}.
std::string submit_jobs(const std::string& spec);
/// .mih-submit/<spec>/states.txt: the scheduler's state of every job, as the final job read it.
std::string submit_states(const std::string& spec);
/// The night's verdict at the evidence root, written by mih submit's final job.
inline constexpr char kNightReportMd[] = "report.md";
inline constexpr char kNightReportHtml[] = "report.html";
inline constexpr char kNightJunit[] = "junit.xml";
inline constexpr char kNightCompare[] = "compare-previous.txt";  ///< `mih compare` with last night's, case by case
/// .mih-submit/<spec>/<job>.sbatch, the batch script of job <job> ("Tp2Sp.train", "verify").
std::string submit_script(const std::string& spec, const std::string& job);
/// .mih-submit/<spec>/<job>.<id>.log: its output (`id` "%j" in the script: SLURM's job id).
std::string submit_log(const std::string& spec, const std::string& job, const std::string& id);

// ---- A launch's run directory (runtime/launcher.h) -----------------------------------------
inline constexpr char kRunLock[] = ".lock";  ///< flock'ed by the launch, holds its pid
inline constexpr char kStore[] = "store";    ///< the FileStore of a launch without a hosted store
inline constexpr char kLaunchRecord[] = "run.json";
inline constexpr char kSelftest[] = "selftest.json";
inline constexpr char kLogsDir[] = "logs";
inline constexpr char kCommDir[] = "comm";
inline constexpr char kErrorsDir[] = "errors";
inline constexpr char kLauncherLog[] = "logs/launcher.log";  ///< a command template's output
inline constexpr char kRankPrefix[] = "rank";                ///< of logs/ and errors/ files
inline constexpr char kLedgerPrefix[] = "ledger_rank";       ///< of comm/ files
inline constexpr char kRankUnknownError[] = "errors/rank_unknown.json";
/// logs/rank<r>.log.
std::string rank_log(int rank);
/// logs/rank<r>.pid.
std::string rank_pid(int rank);
/// errors/rank<r>.json.
std::string rank_error(int rank);
/// comm/ledger_rank<r>.jsonl.
std::string ledger_rank(int rank);
/// state_rank<r>.json (mih selftest).
std::string selftest_state_rank(int rank);

// ---- mih inspect's output ------------------------------------------------------------------
inline constexpr char kInventoryDir[] = "inventory";
inline constexpr char kInventoryCandidate[] = "inventory/candidate.json";
inline constexpr char kInventoryReference[] = "inventory/reference.json";
inline constexpr char kStructureDiff[] = "inventory/structure_diff.json";
inline constexpr char kInventoryFingerprints[] = "inventory/fingerprints.sha256";

// ---- A golden directory and mih golden's export ----------------------------------------------
inline constexpr char kGoldenManifest[] = "golden.json";
inline constexpr char kGoldenTensors[] = "golden.safetensors";  ///< the manifest's default tensors_file
inline constexpr char kExportDir[] = "export";
/// An export's own record: what it describes, and the SHA-256 of each file it wrote.
inline constexpr char kExportRecord[] = "mih_export.json";
inline constexpr char kExportBatch[] = "batch.safetensors";
inline constexpr char kExportReference[] = "reference.safetensors";
inline constexpr char kExportTraining[] = "training.json";

// ---- mih faults' output --------------------------------------------------------------------
inline constexpr char kFaultsReport[] = "faults.json";  ///< the default --json
inline constexpr char kMarkdownExtension[] = ".md";     ///< the report's table beside it
inline constexpr char kMatricesDir[] = "matrices";
inline constexpr char kFaultFreeDir[] = "fault-free";
inline constexpr char kContrastDir[] = "contrast";
inline constexpr char kTestLog[] = "mih_test.log";
/// matrices/<spec>.json.
std::string fault_matrix(const std::string& spec);
/// mih_test_<spec>.log (a fault-free twins' run).
std::string twins_test_log(const std::string& spec);
/// mih_test.log (round 0) or mih_test_<round>.log: a contrast run.
std::string contrast_test_log(int round);

// ---- Foreign formats mih reads and writes ----------------------------------------------------
inline constexpr char kHfConfig[] = "config.json";
inline constexpr char kHfWeights[] = "model.safetensors";
inline constexpr char kHfIndex[] = "model.safetensors.index.json";
inline constexpr char kHfShardPrefix[] = "model-";  ///< model-00001-of-00002.safetensors
inline constexpr char kHfBlobsDir[] = "blobs";      ///< a hub cache's blobs, beside snapshots/
inline constexpr char kHfSnapshotsDir[] = "snapshots";
inline constexpr char kDistributedCheckpointIndex[] = "index.json";
/// rank<r, 5 digits>.safetensors: a distributed checkpoint's file of rank r.
std::string checkpoint_rank_file(int rank);
/// model-<i, 5 digits>-of-<n, 5 digits>.safetensors: shard i (from 1) of a sharded HF checkpoint.
std::string hf_shard(size_t i, size_t n);
inline constexpr char kScaffoldRecord[] = "mih_scaffold.json";  ///< mih scaffold's record of a port

}  // namespace mih::layout
