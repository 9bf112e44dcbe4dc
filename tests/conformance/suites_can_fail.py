#!/usr/bin/env python3
"""The suites' own mutation matrix (ctest SuitesCanFail, label faults): for every TEST_P of the
suite table, one input on which it fails, or this test fails.

An input is either a fault of the catalog (the `mih faults` detection matrix, faults.json: the
tests that failed on the faulty run) or a copy of real evidence broken the way the bug would
break it: a clean base run of a few cases is made here with `mih test`, each mutation copies one
spec's evidence, breaks one file and runs `mih check` (verify-only) on the case, and the target
test must fail (read from GoogleTest's JSON report: `mih check` writes nothing into the evidence). Mutations that add a finding write the one the check emits for that bug (the
checks themselves are proven on failing inputs in tests/session); the others break what a bug
would: a step missing after a resume, a parameter outside every FSDP unit, recomputation off, a
module parity case's gradient observation failed.

Also fails when the base run is not clean, when a mutation's test does not fail, or when a
finding code a mutation asserts was never the finding of a check (its check recorded no run in
the base evidence). Prints one line per test and `N/N tests proven able to fail`.
Exit status: 0 every test proven; 1 otherwise; 2 usage."""
import argparse
import json
import os
import shutil
import subprocess
import sys

SPECS_OF_PREFIX = {"Llama": "llama", "Moe": "moe", "Vlm": "vlm", "LlamaTied": "llama_tied",
                   "LlamaBias": "llama_bias", "LlamaDropout": "llama_dropout",
                   "LlamaUnshardedRoot": "llama_unsharded_root",
                   "VlmFrozenVision": "vlm_frozen_vision", "LlamaEpochs": "llama_epochs"}
# The cases of the clean base run: where every mutation's test applies.
BASE = ["Llama/*.*/Reference", "Llama/*.*/DpShard2", "Llama/*.*/DpShard2Ac", "Llama/*.*/Tp2Sp",
        "Llama/*.*/ResumeDpShard2", "Llama/*.*/Pp2Mb4", "Vlm/*.*/Reference", "Vlm/*.*/Cp2Zz", "VlmFrozenVision/*.*/Reference",
        "VlmFrozenVision/*.*/DpShard2"]


def finding(code, owner, message):
    """Adds the error finding `code` to check/findings.json, as its check writes it."""
    def apply(case_dir):
        path = os.path.join(case_dir, "check", "findings.json")
        with open(path) as f:
            j = json.load(f)
        j["findings"].append({"code": code, "phase": "runtime", "owner": owner, "severity": "error",
                              "message": message, "facts": {}, "why_unsafe": "mutation",
                              "remediation": "mutation"})
        j["status"] = "FAIL"
        with open(path, "w") as f:
            json.dump(j, f)
    apply.code = code
    return apply


def edit_json(relative, fn):
    def apply(case_dir):
        path = os.path.join(case_dir, relative)
        with open(path) as f:
            j = json.load(f)
        fn(j)
        with open(path, "w") as f:
            json.dump(j, f)
    return apply


def drop_first_metrics_row(case_dir):
    path = os.path.join(case_dir, "cases", "runtime", "metrics.jsonl")
    with open(path) as f:
        lines = [l for l in f if l.strip()]
    with open(path, "w") as f:
        f.writelines(lines[1:])


def backward_before_forward(case_dir):
    """The last pp rank's first backward moved before its forward (a schedule that runs a
    micro-batch's backward on activations it never computed)."""
    path = os.path.join(case_dir, "cases", "runtime", "performance_rank1.jsonl")
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    order = rows[0]["pipeline_order"]
    b = next(i for i, a in enumerate(order) if a.startswith("B"))
    f_ = next(i for i, a in enumerate(order) if a.startswith("F") and a[1:] == order[b][1:])
    order[f_], order[b] = order[b], order[f_]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def activations_sent_twice(case_dir):
    """Every pp activation message counted twice in rank 0's traffic (a stage that
    sends each activation again), the axis total with it."""
    path = os.path.join(case_dir, "cases", "runtime", "metrics.jsonl")
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    for r in rows:
        extra = r["comm_sites"]["pp"]["pipeline.activation"]
        r["comm_sites"]["pp"]["pipeline.activation"] += extra
        r["comm_bytes"]["pp"] += extra
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def lr_schedule_stepped_twice(case_dir):
    """The learning-rate scheduler stepped twice per step on the case (an extra
    scheduler.step() in a gradient-accumulation loop): its lr from step 1 on is the next one's."""
    path = os.path.join(case_dir, "cases", "runtime", "metrics.jsonl")
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    for r in rows[1:]:
        r["lr"] *= 0.5
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def unit_loses_a_parameter(units):
    for u in units.values():
        if u.get("parameters"):
            u["parameters"].pop()
            return


def parity_case_fails(results):
    # The output matches; the gradient of one parameter does not (the engine's observation of a
    # backward that lost the weight: the reference's gradient undefined, counted as zero).
    case = results["fused_swiglu_vs_unfused"]
    grad = next(o for o in case["observations"] if o["name"] == "grad:down_proj.weight")
    grad.update(relative_error=1.0, passed=False,
                note="the reference's gradient is undefined: the tensor does not reach its output (counted as zero)")
    case["passed"] = False


# test -> (spec, case, what the bug is, mutation)
MUTATIONS = {
    "ActivationCheckpointEquivalence.RegionsRecomputed":
        ("llama", "DpShard2Ac", "the model ignored activation checkpointing",
         edit_json("check/activation_checkpoint.json", lambda j: j.update(enabled=False))),
    "CheckpointCoverage.TransformsRoundTrip":
        ("llama", "DpShard2", "a fused split whose inverse writes gate twice",
         finding("MIH-CKPT-002", "layers.0.mlp.gate_up_proj.weight", "values differ after to_external then from_external")),
    "CpReplicatedInputs.FieldsAgreeOverCp":
        ("vlm", "Cp2Zz", "pixel_values sharded over cp like a sequence field",
         finding("MIH-INPUT-001", "pixel_values", "cp-replicated field 'pixel_values' differs between cp rank 0 and cp rank 1")),
    "DataContract.EveryFieldHasOneOwner":
        ("llama", "DpShard2", "position_ids written by the pipeline and by the runtime",
         finding("MIH-DATA-003", "position_ids", "field 'position_ids' is produced by the pipeline and declared runtime-owned")),
    "NumericParity.LearningRateMatchesReference":
        ("llama", "DpShard2", "an lr scheduler stepped twice per step", lr_schedule_stepped_twice),
    "PipelineSchedule.EveryRankRanAValidOrder":
        ("llama", "Pp2Mb4", "a 1F1B rank that runs a micro-batch's backward before its forward", backward_before_forward),
    "PipelineOutputs.FieldsRecomputedFromTheRawDocuments":
        ("llama", "DpShard2", "packed positions that do not restart at a document start (the reference shares them)",
         finding("MIH-DATA-009", "position_ids", "field 'position_ids' differs from its recomputation from the raw "
                 "documents at 40 of 512 positions; first at row 0, position 12: recomputed 0, the pipeline gave 12")),
    "DataContract.LabelsShiftedAsDeclared":
        ("llama", "DpShard2", "labels shifted twice by the pipeline",
         finding("MIH-DATA-004", "labels", "labels are declared shifted, but on 500 of 512 valid positions they are not the next input token")),
    "FsdpUnits.EveryShardedParameterInOneUnit":
        ("llama", "DpShard2", "a sharded parameter registered outside every FSDP unit",
         edit_json("check/fsdp_units.json", unit_loses_a_parameter)),
    "FsdpUnits.UnitsHoldOneDtypeAndMesh":
        ("llama", "DpShard2", "a float32 norm in a float64 unit",
         finding("MIH-STRUCT-006", "layers.0", "FSDP unit mixes dtypes or meshes")),
    "FrozenParameters.RequireNoGradOnEveryRank":
        ("vlm_frozen_vision", "DpShard2", "a backend that ignores the frozen declaration",
         finding("MIH-FROZEN-001", "vision_tower.embeddings.patch_embedding.weight",
                 "declared frozen (ModelSpec::frozen) but requires_grad is true on this rank")),
    "FrozenParameters.GetNoGradientAndNoOptimizerState":
        ("vlm_frozen_vision", "DpShard2", "an optimizer built over every parameter, frozen ones too",
         finding("MIH-FROZEN-004", "vision_tower.embeddings.patch_embedding.weight",
                 "declared frozen and has AdamW state 'exp_avg' at step 0")),
    "GradientPresence.OptimizerLeavesParametersWithoutGradient":
        ("llama", "DpShard2", "zeros fed to AdamW for a parameter no rank gave a gradient (decayed and moved)",
         finding("MIH-OPTIM-008", "norm.weight",
                 "'norm.weight' had no gradient on any rank at step 1 and the optimizer step changed it")),
    "GradientPresence.EveryTrainableParameterGetsAGradient":
        ("llama", "DpShard2", "a head the forward never reaches (registered, optimized, never trained)",
         finding("MIH-GRAD-004", "lm_head.weight",
                 "'lm_head.weight' is trainable and no rank's backward gave it a gradient in any of the 3 steps")),
    "GradientSync.EachGradientReducedOverItsDomain":
        ("llama", "DpShard2", "a gradient hook that skips the reduce-scatter of one parameter",
         finding("MIH-GRAD-001", "norm.weight", "gradient never reduced over {dp_shard} at step 0")),
    "OptimizerLayout.NoParameterFrozenWithoutDeclaration":
        ("llama", "DpShard2", "a norm reloaded under no_grad, silently frozen",
         finding("MIH-FROZEN-002", "norm.weight",
                 "requires_grad is false on this rank and no ModelSpec::frozen pattern names it")),
    "ModuleParity.CandidatesMatchIndependentImplementations":
        ("llama", "Reference", "the fused SwiGLU's down_proj gradient lost in backward (its output still matches)",
         edit_json("check/module_parity.json", parity_case_fails)),
    "OptimizerLayout.NoFrozenParameter":
        ("llama", "DpShard2", "a frozen parameter left in the optimizer",
         finding("MIH-OPTIM-003", "embed_tokens.weight", "frozen parameter (requires_grad false) in the optimizer")),
    "OptimizerLayout.NoWeightDecayOnNormsOrBiases":
        ("llama", "DpShard2", "GPT-2 norm names (ln_1) missed by the no-decay patterns",
         finding("MIH-OPTIM-007", "layers.0.input_layernorm.weight", "1-D parameter has weight decay 0.1")),
    "OptimizerLayout.StateShapesMatchLocalShards":
        ("llama", "DpShard2", "optimizer state not resharded",
         finding("MIH-OPTIM-006", "embed_tokens.weight", "exp_avg has shape [256, 32], the local parameter [128, 32]")),
    "OptimizerLayout.WeightDecayAsDeclared":
        ("llama", "DpShard2", "norms decayed against the declared groups",
         finding("MIH-OPTIM-005", "norm.weight", "weight decay 0.100000, declared 0.000000")),
    "Resume.StepCountContinues":
        ("llama", "ResumeDpShard2", "the step counter restarts after the load (first step lost)", drop_first_metrics_row),
    "SharedState.EveryKeyHasProducerAndConsumer":
        ("llama", "DpShard2", "the rotary table never published",
         finding("MIH-SHARED-001", "rotary.cos", "declared shared state 'rotary.cos' was never published")),
    "SharedState.ConsumedAfterPublished":
        ("llama", "DpShard2", "a layer reading the rotary table before the producer ran",
         finding("MIH-SHARED-003", "rotary.cos", "'layers.0' consumed shared state 'rotary.cos' before it was published")),
    "UndeclaredSharedState.NoKeyWithoutDeclaration":
        ("llama", "DpShard2", "a routing cache shared between layers without a declaration",
         finding("MIH-SHARED-006", "routing.cache", "shared state 'routing.cache' is published or consumed but not declared")),
    "Structure.DtypeAndDeviceAsConfigured":
        ("llama", "DpShard2", "a parameter cast to float32 after creation",
         finding("MIH-STRUCT-002", "norm.weight", "parameter is float32 on cpu, the run's parameters are float64 on cpu")),
    "Structure.EveryAliasIsADeclaredTie":
        ("llama", "DpShard2", "the q_proj module registered again as k_proj (one tensor, two names, no declared tie)",
         finding("MIH-STRUCT-008", "layers.0.self_attn.q_proj.weight",
                 "'layers.0.self_attn.q_proj.weight' and 'layers.0.self_attn.k_proj.weight' name the same tensor")),
    "Structure.LocalShapesMatchPlacements":
        ("llama", "DpShard2", "a row-parallel weight sharded on the wrong dim",
         finding("MIH-STRUCT-001", "layers.0.self_attn.o_proj.weight", "local shape inconsistent with placements")),
    "Structure.ParametersAndBuffersFinite":
        ("llama", "DpShard2", "a parameter left uninitialized (NaN)",
         finding("MIH-STRUCT-003", "layers.1.mlp.down_proj.weight", "parameter holds NaN or Inf after initialization")),
    "TensorParallelInputs.RanksSeeTheSameInputs":
        ("llama", "Tp2Sp", "the batch split over tp ranks as if they were data-parallel",
         finding("MIH-INPUT-002", "global_batch", "tp rank 1 saw other inputs than tp rank 0 at step 0")),
}


# Further inputs a test proven above (or by a fault) must also fail on: test -> [(spec, case,
# bug, mutation)]; a check a new axis adds to an existing test is shown failing here.
ALSO = {
    "CommVolume.BytesPerAxisMatchTheConfig": [
        ("llama", "Pp2Mb4", "a pipeline stage that sends each activation twice", activations_sent_twice)],
}


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def all_tests(mih):
    out = run([mih, "test", "--prefixes", ",".join(SPECS_OF_PREFIX), "--gtest_list_tests"])
    if out.returncode != 0:
        sys.exit("mih test --gtest_list_tests failed:\n" + out.stdout)
    tests, suite = set(), None
    for line in out.stdout.splitlines():
        if not line or line.startswith("["):
            continue
        if not line.startswith(" "):
            suite = line.split("/")[1].rstrip(".") if "/" in line else None
        elif suite:
            tests.add(suite + "." + line.strip().split("/")[0])
    return tests


def gtest_results(path):
    """The tests of a GoogleTest JSON report (--gtest_output=json:FILE) as results.jsonl rows
    (suite, test, case, status, message): `mih check` writes nothing into the evidence it
    judges, so its results come back this way."""
    try:
        with open(path) as f:
            j = json.load(f)
    except (OSError, ValueError):
        return []
    rows = []
    for s in j.get("testsuites", []):
        suite = s.get("name", "").split("/")[-1]
        for t in s.get("testsuite", []):
            if t.get("status") == "NOTRUN":
                continue
            test, _, case = t.get("name", "").partition("/")
            failures = [f.get("failure", "") for f in t.get("failures", [])]
            status = "failed" if failures else "skipped" if t.get("result") == "SKIPPED" else "passed"
            rows.append({"suite": suite, "test": test, "case": case, "status": status, "message": "\n".join(failures)})
    return rows


def results(root):
    path = os.path.join(root, "results.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    return [r for r in rows if "run" not in r]  # a process's start and end lines are not tests


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mih", required=True)
    p.add_argument("--faults-json", required=True, help="the detection matrix of `mih faults --json`")
    p.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = p.parse_args()
    if not os.path.exists(a.faults_json):
        print(f"{a.faults_json} is missing: run the fault catalog first (ctest -R '^faults$', or mih faults --json FILE)")
        return 1
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    tests = all_tests(a.mih)
    proven = {}
    with open(a.faults_json) as f:
        matrix = json.load(f)
    for row in matrix["faults"]:
        for t in row.get("failed_tests", []):
            proven.setdefault(t, f"fault {row['id']} ({row['kind']}: {row['fault']})")
    base = os.path.join(a.work, "base")
    out = run([a.mih, "test", "--evidence-root", base, "--no-progress", "--gtest_brief=1", "--prefixes", "Llama,Vlm,VlmFrozenVision",
               "--gtest_filter=" + ":".join(BASE)])
    if out.returncode != 0:
        print("the clean base run failed (every mutation needs a clean input):\n" + out.stdout[-4000:])
        return 1
    base_results = results(base)
    checks_ran = set()
    for line in base_results:
        for part in line.get("examined", "").split("; "):
            if " examined " in part:
                checks_ran.add(part.split(" examined ")[0])
    problems = []
    inputs = [(test, *m) for test, m in sorted(MUTATIONS.items())]
    inputs += [(test, *m) for test, ms in sorted(ALSO.items()) for m in ms]
    for i, (test, spec, case, bug, mutate) in enumerate(inputs):
        if test not in tests:
            problems.append(f"mutation for {test}, which is no TEST_P of the suite table")
            continue
        root = os.path.join(a.work, f"m{i:02d}")
        shutil.copytree(os.path.join(base, spec), os.path.join(root, spec))
        mutate(os.path.join(root, spec, case))
        report = os.path.join(a.work, f"m{i:02d}.json")
        out = run([a.mih, "check", os.path.join(root, spec, case), "--allow-edited-evidence", "--no-progress",
                   "--gtest_brief=1", "--gtest_output=json:" + report])
        mine = [r for r in gtest_results(report) if f"{r['suite']}.{r['test']}" == test and r["case"] == case]
        if not mine:
            problems.append(f"{test}: not run by `mih check` on {spec}/{case} (exit {out.returncode}):\n{out.stdout[-1500:]}")
        elif mine[0]["status"] != "failed":
            problems.append(f"{test}: passed on {spec}/{case} with {bug}")
        else:
            proven.setdefault(test, f"{spec}/{case} evidence broken: {bug}")
            code = getattr(mutate, "code", None)
            if code and not any(code in r["message"] for r in mine):
                problems.append(f"{test}: failed without naming {code}")
            # The code's emitting check ran on the clean case (the test says what it examined).
            clean = [r for r in base_results if f"{r['suite']}.{r['test']}" == test and r["case"] == case]
            if code and not (clean and clean[0].get("examined")):
                problems.append(f"{test}: asserts {code}, whose check left no record on the clean {spec}/{case}")
    missing = sorted(tests - proven.keys())
    width = max(len(t) for t in tests)
    for t in sorted(tests):
        print(f"{t:<{width}}  {proven.get(t, 'NOT PROVEN: no input makes it fail')}")
    print(f"{len(tests) - len(missing)}/{len(tests)} tests proven able to fail")
    print(f"checks whose run the base evidence records: {', '.join(sorted(checks_ran))}")
    for msg in problems:
        print("PROBLEM: " + msg)
    return 0 if not missing and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
