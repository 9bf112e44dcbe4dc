#!/usr/bin/env python3
"""ctest OwnTrainer: a libtorch trainer of its own (tests/own_trainer/own_trainer.cpp: its own
c10d groups, model, gradient synchronization, ZeRO-3 and tensor parallelism, AdamW), driven
through mih::TrainerSession, writes the evidence contract that mih judges.

Runs, with Debian's torchrun (1.13; `-r 1 -t 1` on Python 3.11, `--no_python` for a binary),
each root on its own so that a bug's case never shares a run with the good ones:
  good/own_mlp/Reference        one process, no torchrun (--parallel none)
  good/own_mlp/DpReplicate2     2 ranks, DDP: every gradient all-reduced over dp_replicate
  good/own_mlp/DpShard2         2 ranks, ZeRO-3 over dp_shard: shards all-gathered,
                                gradients reduce-scattered, AdamW stepping the shards
  good/own_mlp/Tp2              2 ranks, Megatron MLP over tp (column- then row-parallel)
  good/own_mlp/DpShard2Resume   DpShard2 saved after step 1 (before_save/) and resumed at step 2
  bug_skip/own_mlp/DpReplicate2 DDP with layers.1.up.weight's all-reduce skipped
  bug_mean/own_mlp/DpReplicate2 DDP with each rank's loss its own tokens' mean, gradients averaged
  bug_ckpt/own_mlp/DpShard2Resume  the resume's load phase restoring the parameters, not AdamW's
                                state (its save phase copied from good/)
(each bug root holds a copy of the Reference), and checks: the good runs follow the contract
(`mih validate`) and pass every suite their evidence holds (`mih check`: NumericParity,
InputIdentity, GradientSync, ReplicaConsistency, CheckpointRoundTrip, through the verdicts of mih's
own cases); the skipped all-reduce fails GradientSync naming
layers.1.up.weight, ReplicaConsistency and NumericParity localized to layers.1.up's weight gradient; the
per-rank mean fails NumericParity, localized to the loss; the lost optimizer state fails
CheckpointRoundTrip naming the AdamW moments.

Usage: check_own_trainer.py --mih build/bin/mih --trainer build/bin/mih_own_trainer --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import Tally, edit_json, free_port  # noqa: E402

SPEC = "own_mlp"
STEPS = "4"
TORCHRUN = "/usr/bin/torchrun"
TALLY = Tally()
fail, ok, expect = TALLY.fail, TALLY.ok, TALLY.expect
PARAMETERS = ["embed.weight"] + [f"layers.{i}.{m}.{p}" for i in range(2) for m, ps in
                                 (("ln", ("weight", "bias")), ("up", ("weight", "bias")), ("down", ("weight", "bias")))
                                 for p in ps] + ["norm.weight", "norm.bias", "head.weight"]


def clean_env():
    """This process's environment without a rendezvous of its own (a ctest run under torchrun)."""
    env = dict(os.environ)
    for var in list(env):
        if var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                   "MASTER_ADDR", "MASTER_PORT") or var.startswith("TORCHELASTIC_"):
            del env[var]
    return env


def train(trainer, case_dir, case, parallel, *extra):
    """Runs one case into case_dir: one process for --parallel none, else 2 ranks under torchrun."""
    cmd = [trainer, "--case-dir", case_dir, "--case", case, "--parallel", parallel, "--steps", STEPS]
    if case != "Reference":
        cmd += ["--compare-to", "Reference"]
    cmd += list(extra)
    if parallel != "none":
        cmd = [TORCHRUN, "--nnodes", "1", "--nproc_per_node", "2", "-r", "1", "-t", "1", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "--no_python"] + cmd
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                           env=clean_env())
    except subprocess.TimeoutExpired as e:
        fail(f"{case_dir}: the trainer did not finish in 300 s\n{(e.stdout or '')[-3000:]}")
        return False
    if p.returncode != 0:
        fail(f"{case_dir}: the trainer exited {p.returncode}\n{' '.join(cmd)}\n{p.stdout[-3000:]}")
        return False
    return True


def test_block(out, test):
    """gtest test `test` (its full name) in `out`: (its output from [ RUN ] to its verdict line, the verdict
    "OK" or "FAILED"), or (None, None) when it did not run."""
    name = re.escape(test) + r"(?=[ ,]|$)"
    m = re.search(r"^\[ RUN      \] " + name + r".*?^\[ *(OK|FAILED) *\] " + name + r"[^\n]*", out, re.S | re.M)
    return (m.group(0), m.group(1)) if m else (None, None)


def expect_test(what, out, test, verdict, *needles):
    """gtest test `test` in `out` ended with `verdict` ("OK" or "FAILED"), its own output saying every needle."""
    if out is None:
        return  # its command failed already
    block, got = test_block(out, test)
    if block is None:
        fail(f"{what}: {test} did not run\n{out[-4000:]}")
        return
    if got != verdict:
        fail(f"{what}: {test} ended {got}, want {verdict}\n{block[-4000:]}")
        return
    for n in needles:
        if n not in block:
            fail(f"{what}: {test} does not say {n!r}\n{block[-4000:]}")
            return
    ok(f"{what}: {test} {verdict}" + (f", saying {', '.join(repr(n) for n in needles)}" if needles else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mih", required=True)
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    if not os.access(TORCHRUN, os.X_OK):
        sys.exit(f"{TORCHRUN} not found: install Debian's python3-torch (scripts/test does)")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    good, skip, mean, lost = (os.path.join(a.work, r) for r in ("good", "bug_skip", "bug_mean", "bug_ckpt"))
    case = lambda root, name: os.path.join(root, SPEC, name)  # noqa: E731

    ran = train(a.trainer, case(good, "Reference"), "Reference", "none")
    ran = train(a.trainer, case(good, "DpReplicate2"), "DpReplicate2", "ddp") and ran
    ran = train(a.trainer, case(good, "DpShard2"), "DpShard2", "zero3") and ran
    ran = train(a.trainer, case(good, "Tp2"), "Tp2", "tp") and ran
    # A resume: saved after step 1 into before_save/, loaded and trained from step 2.
    ckpt = os.path.join(a.work, "ckpt", "DpShard2Resume")  # outside the evidence roots
    os.makedirs(ckpt)
    resume = case(good, "DpShard2Resume")
    saved = train(a.trainer, os.path.join(resume, "before_save"), "DpShard2Resume", "zero3", "--save-at", "2",
                  "--ckpt", ckpt)
    ran = saved and train(a.trainer, resume, "DpShard2Resume", "zero3", "--load", "--ckpt", ckpt) and ran
    for root, bug in ((skip, "skip_allreduce"), (mean, "per_rank_mean")):
        if os.path.isdir(case(good, "Reference")):
            shutil.copytree(case(good, "Reference"), case(root, "Reference"))
        ran = train(a.trainer, case(root, "DpReplicate2"), "DpReplicate2", "ddp", "--bug", bug) and ran
    # The resume's load phase with AdamW's state left behind, after the good save phase.
    if os.path.isdir(case(good, "Reference")) and os.path.isdir(os.path.join(resume, "before_save")):
        shutil.copytree(case(good, "Reference"), case(lost, "Reference"))
        shutil.copytree(os.path.join(resume, "before_save"), os.path.join(case(lost, "DpShard2Resume"), "before_save"))
        ran = train(a.trainer, case(lost, "DpShard2Resume"), "DpShard2Resume", "zero3", "--load", "--ckpt", ckpt,
                    "--bug", "skip_optimizer_load") and ran
    if not ran:
        return 1

    # The contract, and every Foreign suite passing the good runs against their 1-rank run.
    expect("mih validate, the good runs", [a.mih, "validate", good], 0, ["written by mih-trainer-session", "(own_trainer 1.0)", ", 0 not following"])
    out = expect("mih check, the good runs", [a.mih, "check", good, "--no-progress"], 0,
                 ["Foreign/NumericParity", "Foreign/GradientSync", "Foreign/ReplicaConsistency",
                  "Foreign/CheckpointRoundTrip", "Foreign/Structure"], absent=["FAILED"])
    # Each suite's own tests (its TEST_P names), through the verdicts that judge mih's cases.
    for name in ("DpReplicate2", "DpShard2", "Tp2", "DpShard2Resume"):
        for test in ("LossMatchesReference", "GradNormsMatchReference", "LearningRateMatchesReference",
                     "WatchedTensorsMatchReferenceAtEveryStage"):
            expect_test("mih check, the good runs", out, f"Foreign/NumericParity.{test}/{SPEC}/{name}", "OK")
        expect_test("mih check, the good runs", out, f"Foreign/InputIdentity.SameGlobalBatchAsReference/{SPEC}/{name}",
                    "OK", "examined the global batch")
    for name in ("DpReplicate2", "DpShard2", "Tp2", "DpShard2Resume"):
        expect_test("mih check, the good runs", out, f"Foreign/GradientSync.EachGradientReducedOverItsDomain/{SPEC}/{name}",
                    "OK")
    for name in ("DpReplicate2", "Tp2"):
        expect_test("mih check, the good runs", out, f"Foreign/ReplicaConsistency.ReplicasAgreeAfterEveryStep/{SPEC}/{name}",
                    "OK", "examined")
    expect_test("mih check, the good runs", out, f"Foreign/CheckpointRoundTrip.LoadedTensorsBitExact/{SPEC}/DpShard2Resume",
                "OK", "resuming at step 2")
    # The parameter table (every case, the reference too): rank 0's rows against their placements.
    for name in ("Reference", "DpReplicate2", "DpShard2", "Tp2", "DpShard2Resume"):
        expect_test("mih check, the good runs", out, f"Foreign/Structure.LocalShapesMatchPlacements/{SPEC}/{name}", "OK",
                    "against their placements")
        expect_test("mih check, the good runs", out, f"Foreign/Structure.DtypeAndDeviceAsConfigured/{SPEC}/{name}", "OK",
                    "all float64")
    # The header: which suites ran on how many cases, what the others need.
    out = expect("mih check, the good runs' header", [a.mih, "check", good], 0,
                 ["Structure (5 case(s)), InputIdentity (4 case(s)), CheckpointRoundTrip (1 case(s)), "
                  "NumericParity (4 case(s)), GradientSync (4 case(s)), ReplicaConsistency (2 case(s))", "37 test(s)",
                  "OptimizerLayout (no optimizer layout record", "FsdpUnits (needs check/fsdp_units.json",
                  "judge records only mih's session writes"])

    # The skipped all-reduce: GradientSync names the one parameter and no other; NumericParity
    # fails, localized.
    out = expect("mih check, layers.1.up.weight's all-reduce skipped", [a.mih, "check", skip, "--no-progress"], 1,
                 ["FAILED", "layers.1.up.weight"])
    test = f"Foreign/GradientSync.EachGradientReducedOverItsDomain/{SPEC}/DpReplicate2"
    expect_test("mih check, layers.1.up.weight's all-reduce skipped", out, test, "FAILED", "'layers.1.up.weight'",
                "a reduction skipped")
    block = test_block(out, test)[0] if out else None
    others = [p for p in PARAMETERS if p != "layers.1.up.weight" and f"'{p}'" in (block or "")]
    if others:
        fail(f"GradientSync blames parameters whose gradients were all-reduced: {others}\n{block[-4000:]}")
    expect_test("mih check, layers.1.up.weight's all-reduce skipped", out,
                f"Foreign/NumericParity.WatchedTensorsMatchReferenceAtEveryStage/{SPEC}/DpReplicate2", "FAILED",
                "localized to 'layers.1.up'",
                "the gradient of parameter 'layers.1.up.weight' is the first to diverge")
    expect_test("mih check, layers.1.up.weight's all-reduce skipped", out,
                f"Foreign/ReplicaConsistency.ReplicasAgreeAfterEveryStep/{SPEC}/DpReplicate2", "FAILED",
                "parameter copies differ after the optimizer")

    # Each rank's own mean, the gradients averaged: the numbers leave the reference, localized;
    # the ranks' gradients still agree with each other (a wrong value, not a missed reduction).
    out = expect("mih check, each rank's loss over its own tokens", [a.mih, "check", mean, "--no-progress"], 1, ["FAILED"])
    expect_test("mih check, each rank's loss over its own tokens", out,
                f"Foreign/NumericParity.LossMatchesReference/{SPEC}/DpReplicate2", "FAILED", "localized to 'loss'")
    expect_test("mih check, each rank's loss over its own tokens", out,
                f"Foreign/GradientSync.EachGradientReducedOverItsDomain/{SPEC}/DpReplicate2", "OK")

    # AdamW's state not restored: the round trip names the moments, and the run leaves the reference.
    out = expect("mih check, the optimizer state not loaded", [a.mih, "check", lost, "--no-progress"], 1, ["FAILED"])
    expect_test("mih check, the optimizer state not loaded", out,
                f"Foreign/CheckpointRoundTrip.LoadedTensorsBitExact/{SPEC}/DpShard2Resume", "FAILED",
                "'embed.weight/exp_avg' is not bit-exact after the load", "and 27 more")
    expect_test("mih check, the optimizer state not loaded", out,
                f"Foreign/NumericParity.WatchedTensorsMatchReferenceAtEveryStage/{SPEC}/DpShard2Resume", "FAILED",
                "localized to")

    # Evidence edited to hide a failure, or to look like what it is not, is refused before any test
    # (exit 12, naming file and field) or fails the test that reads it; never a silent pass.
    edits = os.path.join(a.work, "edits")

    def edited(tag, mutate):
        root = os.path.join(edits, tag)
        for name in ("Reference", "DpReplicate2"):
            shutil.copytree(case(good, name), case(root, name))
        mutate(case(root, "DpReplicate2"), case(root, "Reference"))
        return root

    runtime = lambda d, f: os.path.join(d, "cases", "runtime", f)  # noqa: E731
    hostile = [
        ("a rank's box emptied", lambda d, r: edit_json(runtime(d, "replicas_step2.json"), lambda v: v["parameters"][
            "head.weight"]["boxes"].__setitem__(1, "[]")), 12, "box '[]' is not a box of a 2-dim tensor"),
        ("a step's replica record removed", lambda d, r: os.remove(runtime(d, "replicas_step2.json")), 12,
         "exists for 3 step(s) and metrics.jsonl has 4"),
        ("a parameter's gradient record removed", lambda d, r: edit_json(runtime(d, "gradient_replicas_step1.json"),
                                                                           lambda v: v["parameters"].pop("head.weight")),
         12, "parameter 'head.weight' of check/structure.json has no record"),
        ("the config's degrees shrunk", lambda d, r: edit_json(os.path.join(d, "config.resolved.json"),
                                                               lambda v: v.__setitem__("dp_replicate", 1)), 12,
         "make 1 rank(s), and environment.json says world_size 2"),
        ("a 2-rank run as the reference", lambda d, r: (shutil.rmtree(r), shutil.copytree(d, r), edit_json(
            os.path.join(r, "environment.json"), lambda v: v["case"].update(name="Reference", compare_to=""))), 12,
         "a case's compare_to is its 1-rank run"),
        ("the last step's metrics cut", lambda d, r: open(runtime(d, "metrics.jsonl"), "w").writelines(
            open(os.path.join(good, SPEC, "DpReplicate2", "cases", "runtime", "metrics.jsonl")).readlines()[:3]), 12,
         "the run did not finish"),
        # A pattern over a long string recursed through std::regex until the stack overflowed.
        ("a box of 100000 characters", lambda d, r: edit_json(runtime(d, "gradient_replicas_step1.json"), lambda v: v[
            "parameters"]["head.weight"]["boxes"].__setitem__(0, "[" + "0" * 100000 + "]")), 12,
         "is not a box of a 2-dim tensor"),
        ("a placement of 300000 characters", lambda d, r: edit_json(runtime(d, "gradient_replicas_step1.json"), lambda v: v[
            "parameters"]["head.weight"]["placements"].__setitem__("dp_replicate", "Shard(" + "1" * 300000 + ")")), 12,
         "a string of 300007 characters"),
        ("a local shape its placements do not make", lambda d, r: edit_json(os.path.join(d, "check", "structure.json"),
         lambda v: v["parameters"][-1].__setitem__("local_shape", [1, 1])), 1, "holds local shape [1,1] on rank 0"),
        ("a parameter of another dtype", lambda d, r: edit_json(os.path.join(d, "check", "structure.json"),
         lambda v: v["parameters"][0].__setitem__("dtype", "float32")), 1, "the float64 lane's parameters are float64"),
        ("a gradient no rank holds", lambda d, r: edit_json(runtime(d, "gradient_replicas_step1.json"), lambda v: v[
            "parameters"]["head.weight"].__setitem__("digests", [None, None])), 1, "no rank holding it has one"),
    ]
    for i, (what, mutate, code, needle) in enumerate(hostile):
        expect(f"mih check, {what}", [a.mih, "check", edited(f"e{i}", mutate), "--no-progress"], code, [needle])

    return TALLY.summary("own trainer")


if __name__ == "__main__":
    sys.exit(main())
