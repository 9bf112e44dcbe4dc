// The validation session (DESIGN.md section 6; the seed tool's trainer session): TrainingHooks
// that run the checks of harness/checks and the probes of harness/probes at each point of a
// training run, merge their findings over the ranks and write the evidence of one case.
//
// Modes: off (make_session returns hooks that do nothing: the training code has no branch),
// build (structure, optimizer layout, data contract, checkpoint coverage and structure
// invariants when the model is attached; forward fields at the first micro-batch), runtime
// (build, plus per step: input identity, shared state, modality gradients, optimizer layout
// before the optimizer, probes at every stage, replica consistency, runtime invariants, the
// metrics row).
//
// Evidence under SessionOptions::evidence_dir (rank 0 writes the shared files, every rank its
// own *_rank<r> files): the case directory of harness/contract/evidence_layout.h, the one
// description of the evidence tree.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/checks/checks.h"
#include "harness/evidence/evidence_store.h"
#include "harness/probes/probes.h"
#include "harness/findings/findings.h"
#include "harness/spec/model_spec.h"
#include "harness/training/trainer.h"

namespace mih {

enum class SessionMode { kOff, kBuild, kRuntime };
std::string session_mode_name(SessionMode mode);
/// Throws: mih::Error{kInvalidSpec} for a name other than off, build, runtime.
SessionMode parse_session_mode(const std::string& name);

struct SessionOptions {
  SessionMode mode = SessionMode::kRuntime;
  /// The case's evidence directory; empty keeps findings and metrics in memory only.
  std::filesystem::path evidence_dir;
  /// The case's config and trainer options (recorded; the optimizer layout and data checks
  /// compare against their weight-decay grouping and cp sharding).
  ParallelConfig config;
  TrainerOptions trainer;
  probes::WatchlistOptions watch;
  /// The last step this run trains (its activations are probed, as are the first two
  /// steps'); -1 when unknown (the first two only).
  int64_t last_step = -1;
  /// Keys of an external checkpoint to check against the spec's key map.
  std::optional<std::vector<std::string>> source_checkpoint_keys;
  /// Where the weights the case trains from come from when they are set after the build (a
  /// Hugging Face checkpoint, a resume checkpoint), in words for the evidence. Then the
  /// materialization invariants wait for weights_loaded() instead of running when the
  /// optimizer is attached. Empty: the build's initialization is what they examine.
  std::string weights_loaded_from;
  /// The evidence directory of the run this session continues (a resume's save phase,
  /// `<case>/before_save`): the steps its check/gradients_received.json records join this
  /// session's in the run-level gradient check (MIH-GRAD-004: a trainable parameter without a
  /// gradient at every step of the run). Empty: this session is the whole run.
  std::filesystem::path continues_evidence;
  /// A later session continues this run (a resume's save phase): the run-level gradient
  /// check records this session's steps in check/gradients_received.json and leaves the
  /// verdict to the session that ends the run.
  bool run_continues = false;
  /// Added to environment.json (torch version, backend, CUDA...).
  nlohmann::json environment = nlohmann::json::object();
  /// The source tree whose git revision environment.json records.
  std::filesystem::path source_dir = ".";
};

class ValidationSession : public TrainingHooks {
 public:
  /// `spec` and `mesh` must outlive the session. Rank 0 writes environment.json,
  /// spec.resolved.json, config.resolved.json and sets the state DISCOVERED.
  /// Throws: mih::Error{kInvalidSpec} if options.mode is off (use make_session), as
  ///   ModelSpec::validate, or kFailedPrecondition if the evidence directory is unwritable.
  ValidationSession(const spec::ModelSpec& spec, SessionOptions options, DeviceMesh& mesh);
  ~ValidationSession() override;

  void attach_optimizer(const TrainingState& state) override;
  void attach_data_pipeline(const BatchSource& batches) override;
  void begin_step(int64_t step) override;
  void record_batch(int64_t step, int micro_batch, int64_t first_row, const Batch& batch) override;
  void record_token_losses(int64_t step, int micro_batch, const at::Tensor& token_losses, const Batch& batch) override;
  void before_gradient_sync(int64_t step) override;
  void after_backward_before_clip(int64_t step) override;
  void after_clip(int64_t step, double grad_norm) override;
  void after_optimizer(int64_t step) override;
  void end_step(const StepMetrics& metrics) override;
  void record_fsdp_trace(int64_t step) override;
  void capture_checkpoint_payload(const std::string& event, const std::filesystem::path& dir,
                                  const nlohmann::json& index) override;

  /// The weights were set after the build, from SessionOptions::weights_loaded_from: runs the
  /// materialization invariants on them (check/invariants_materialization.json; each result
  /// names the weights it examined) and checks their values are finite again
  /// (check/loaded_values.json; MIH-STRUCT-003 naming the parameter and the weights). Call on
  /// every rank once the load is done, before the first step; finish() fails the case when it
  /// was never called.
  /// Throws: mih::Error{kInvalidSpec} when weights_loaded_from is empty or on a second call.
  void weights_loaded();

  /// The findings merged over every rank so far (the same on every rank).
  const FindingReport& findings() const { return findings_; }
  /// The metrics rows of the steps so far (runtime mode).
  const std::vector<nlohmann::json>& metrics() const { return metrics_; }
  /// This rank's performance rows so far: step_ms, peak_memory_bytes, comm_bytes per axis,
  /// session_ms (wall time spent in each hook during the step).
  const std::vector<nlohmann::json>& performance() const { return performance_; }
  /// The input identity of each step so far ({"global", "fields", "rows", "step"}).
  const std::vector<nlohmann::json>& input_identity() const { return input_identity_; }
  /// The evidence directory, or null when in memory only.
  const EvidenceDir* evidence() const { return evidence_.get(); }

  /// Bytes per axis of training's collectives since the last step (the session's own
  /// excluded), which the next step's metrics then do not count: call it after traffic that
  /// belongs to no step (a checkpoint's, a gather for evidence).
  nlohmann::json take_comm_bytes(nlohmann::json* sites = nullptr);
  // The layers' declared collectives since the last call ({axis: {site: bytes}}), and per
  // layer in `by_layer` ({axis: {site: {layer: bytes}}}).
  nlohmann::json take_expected_comm(nlohmann::json* by_layer);

  /// Records a failure that escaped the checks or training (an exception from a hook or the
  /// model): the case becomes FAILED with `reason`, the findings so far are written. No
  /// collective: safe on a subset of ranks. Idempotent.
  void fail_case(const std::string& reason);
  /// Ends the case: writes check/findings.json and sets the state: FAILED with the error
  /// summary if any finding is an error, else STRUCTURE_VALIDATED. No collective. Returns
  /// true when no error was found.
  bool finish();

 private:
  template <class Fn>
  void guarded(const char* hook, Fn&& fn);
  // The valid-token check over every rank's end_step figures (all of merge's gather).
  void check_valid_tokens(const std::vector<nlohmann::json>& all, int64_t step);
  // Adds the findings of `from` to `into`, and its run records to this rank's findings_.
  void take(FindingReport& into, const FindingReport& from);
  // Merges this rank's new findings over the world (a collective) and writes them.
  void merge(FindingReport local, const nlohmann::json& perf = nullptr);
  void write(std::string_view relative, const nlohmann::json& j) const;
  // A file of one step (cases/runtime/*_step<N>.json): written without an fsync
  // (Durability::kDeferred), since a session writes several at every step.
  void write_step(std::string_view relative, const nlohmann::json& j) const;
  // A line of a JSONL file and a text file, written by rank 0 (buffered per stage under pp, as
  // write and write_step are).
  void append(std::string_view relative, const nlohmann::json& line) const;
  void write_text(std::string_view relative, const std::string& text) const;
  void write_rank_file(std::string_view relative, const nlohmann::json& j) const;
  // The device the session's collectives stage their buffers on (the CPU before attach).
  c10::Device device() const;
  bool runtime() const { return options_.mode == SessionMode::kRuntime; }
  void probe(probes::Stage stage, int64_t step);
  // The materialization invariants on the weights as they are now, which came from `weights`
  // (named in each result): their findings into `into`, their results to the evidence.
  void materialization_invariants(FindingReport& into, const std::string& weights);
  // The activation probes of the step (collective): two probe lines, forward_output and
  // output_grad.
  void probe_activations(int64_t step);
  // At finish: the run-level gradient check (MIH-GRAD-004) over this session's steps and
  // those of the run it continues; writes check/gradients_received.json.
  void gradients_received();
  // Whether the mesh has pp > 1. Then the writes are buffered by each stage's writing rank
  // (its rank within the stage is 0; rank 0 for the first stage), and the collective over
  // those ranks (the pp group of rank 0) merges them into rank 0's files.
  bool pipelined() const;
  void flush_stage_evidence();
  void buffer_stage_evidence(std::string_view relative, const nlohmann::json& j, const char* how) const;


  const spec::ModelSpec* spec_;
  SessionOptions options_;
  DeviceMesh* mesh_;
  TrainingState state_;
  std::unique_ptr<EvidenceDir> evidence_;
  std::unique_ptr<IntegrationStateMachine> machine_;
  FindingReport findings_;
  FindingReport pending_;  // this rank's findings since the last merge
  std::vector<probes::WatchEntry> watchlist_;
  // The declared shared state of this rank's modules (under pp, of its stage's; else all).
  std::vector<spec::SharedStateSpec> shared_state_;
  std::unique_ptr<checks::InputIdentity> identity_;
  std::set<std::string> fields_seen_;
  std::vector<nlohmann::json> metrics_, input_identity_, performance_;
  int64_t tokens_seen_ = 0, rows_seen_ = 0;
  // Labels != -100 of the micro-batches this rank received in the step (recounted here, to be
  // compared with what the Trainer reports and divides the loss by).
  int64_t labels_seen_ = 0;
  // The first step this session trained (0, or resume_at after a checkpoint load): the data
  // checks of the first micro-batch run on it.
  int64_t first_step_ = -1;
  size_t ledger_seen_ = 0;
  // Activation checkpointing as it happened: each step's checkpointed forwards and recomputes
  // per region (check/activation_checkpoint.json "steps"), and the running totals seen so far.
  nlohmann::json checkpoint_steps_ = nlohmann::json::array();
  std::map<std::string, std::pair<int64_t, int64_t>> checkpoint_seen_;
  // Wall time spent in each hook since the last end_step, milliseconds (the session's own
  // cost, written to performance_rank<r>.jsonl).
  std::map<std::string, double> hook_ms_;
  bool failed_ = false;
  // The materialization invariants ran (at attach, or at weights_loaded()).
  bool materialized_ = false;
  // This step probes everything (the first two steps and the last): activations, clipped
  // gradients, optimizer state.
  bool full_probe_step_ = true;
  // Gradient presence: this step's pieces, before the optimizer, of the parameters no rank
  // gave a gradient; the parameters some rank gave one at some step; the steps examined.
  std::map<std::string, at::Tensor> without_gradient_before_;
  std::set<std::string> gradient_received_;
  std::vector<int64_t> presence_steps_;
  // Under pp: what this stage's writing rank wrote since the last flush, in order
  // ({"path", "how": "json" | "step" | "append" | "text", "value"}).
  mutable nlohmann::json stage_evidence_ = nlohmann::json::array();
  // Under pp: the runs of checks this rank recorded since the last merge, which rank 0 adds
  // to its record when this rank writes for a later stage (its checks examined that stage).
  FindingReport stage_runs_;
  // Under pp: the run-level gradient check ran at the last step (its collective), not at finish.
  bool gradients_checked_ = false;
  // The trainable parameters' names, as of the last backward: finish() runs when the backend,
  // and the parameters with it, may be gone.
  std::vector<checks::ParameterNames> trainable_;
};

/// The session for `options.mode`: hooks that do nothing when off, else a
/// ValidationSession. Throws: as ValidationSession.
std::unique_ptr<TrainingHooks> make_session(const spec::ModelSpec& spec, SessionOptions options, DeviceMesh& mesh);

}  // namespace mih
