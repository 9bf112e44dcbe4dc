#!/usr/bin/env python3
"""ctest PythonEvidenceWriter: python/mih_evidence.py, driven by a PyTorch loop of its own
(tests/python/ddp_trainer.py), writes the evidence contract that mih judges.

Runs with Debian's python3-torch (1.13; torchrun needs `-r 1 -t 1` on Python 3.11; its FSDP
fails at import there, so FSDP-in-Python is untested here):
  Reference          one process, no torch.distributed
  DpReplicate2       torchrun, 2 ranks, DDP, 2 micro-batches (no_sync on the first)
  DpReplicate2Zero   torchrun, 2 ranks, DDP + ZeroRedundancyOptimizer
  BugPerRankMean     DpReplicate2Zero's loop with each rank's loss averaged over its own targets
  BugNoSync          DpReplicate2's loop with the last micro-batch under no_sync (its gradient is
                     never all-reduced)
  BugRankLr          DDP with rank 1 stepping at twice the lr at the last step (its replica
                     leaves rank 0's; the probes, global values of rank 0, match)
  DpReplicate2Strided  DDP, 2 micro-batches, rank r taking rows r, r + 2, ... of the global batch
                     (a DistributedSampler's share), declared row by row
  BugRowsAsFirst     the same rows declared by each micro-batch's first row (contiguous): all that
                     the 0.2 writer could say, which failed a correct loop
  example/*          python/mih_evidence_example.py, the installed example loop (DistributedSampler
                     shuffled, DataLoader, micro-batches), on 1 and 2 ranks
and checks: every directory follows the contract (`mih validate`, and Debian's python3-jsonschema
against the installed schemas); `mih check` and `mih compare` pass the correct runs against the
1-rank Reference and fail each bug, naming the divergence; an edited file is refused (exit 12).

Usage: torch_writer.py --mih build/bin/mih --work DIR --schemas schemas/evidence/v1
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import Tally, free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TALLY = Tally()
fail, FAILED = TALLY.fail, TALLY.failed


EXAMPLE = os.path.join(HERE, "..", "..", "python", "mih_evidence_example.py")


def train(root, case, ranks, *extra, program=os.path.join(HERE, "ddp_trainer.py"), spec="tiny"):
    out = os.path.join(root, spec, case)
    cmd = [sys.executable, program, "--out", out, "--case", case]
    if case != "Reference":
        cmd += ["--compare-to", "Reference"]
    cmd += list(extra)
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if ranks > 1:
        torchrun = shutil.which("torchrun")
        if not torchrun:
            sys.exit("torchrun not found: install Debian's python3-torch (scripts/test does)")
        cmd = [torchrun, "--nnodes", "1", "--nproc_per_node", str(ranks), "-r", "1", "-t", "1",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port())] + cmd[1:]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
    if p.returncode != 0:
        fail(f"{case}: the trainer exited {p.returncode}\n{p.stdout[-3000:]}")
    return out


def expect(what, cmd, code, *needles):
    return TALLY.expect(what, cmd, code, needles) or ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--schemas", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    good, bugs = os.path.join(a.work, "good"), os.path.join(a.work, "bugs")
    ref = train(good, "Reference", 1)
    ddp = train(good, "DpReplicate2", 2, "--micro-batches", "2")
    zero = train(good, "DpReplicate2Zero", 2, "--zero")
    shutil.copytree(ref, os.path.join(bugs, "tiny", "Reference"))
    mean = train(bugs, "BugPerRankMean", 2, "--zero", "--bug", "per_rank_mean")
    nosync = train(bugs, "BugNoSync", 2, "--micro-batches", "2", "--bug", "no_sync_drop")
    replicas = train(bugs, "BugRankLr", 2, "--bug", "rank_lr_last")
    strided = train(good, "DpReplicate2Strided", 2, "--micro-batches", "2", "--rows", "strided")
    as_first = train(bugs, "BugRowsAsFirst", 2, "--rows", "strided", "--bug", "rows_as_first")
    example = [train(good, "Reference", 1, program=EXAMPLE, spec="example"),
               train(good, "DpReplicate2", 2, "--micro-batches", "2", program=EXAMPLE, spec="example")]
    if FAILED:
        return 1

    # The contract, by both implementations.
    expect("mih validate, the Python writer's evidence", [a.mih, "validate", good, bugs], 0,
           "written by mih-evidence.py", "11 case directories, 0 not following")
    sys.path.insert(0, os.path.join(HERE, "..", "evidence"))
    import contract_check  # Debian's python3-jsonschema against the schema files
    contract = contract_check.Contract(a.schemas)
    dirs = (ref, ddp, zero, mean, nosync, replicas, strided, as_first, *example)
    for d in dirs:
        files, values, problems = contract.problems(d)
        if problems:
            fail(f"python3-jsonschema: {d}: {problems[:3]}")
    print(f"ok: python3-jsonschema: {len(dirs)} case directories valid", flush=True)

    # The correct runs equal their 1-rank run; the checks say what they examined.
    out = expect("mih check, DDP, DDP + ZeroRedundancyOptimizer, a sampler's rows and the example against the 1-rank run",
                 [a.mih, "check", good], 0, "Foreign/NumericParity.LossMatchesReference/tiny/DpReplicate2",
                 "Foreign/NumericParity.WatchedTensorsMatchReferenceAtEveryStage/tiny/DpReplicate2Zero",
                 "Foreign/InputIdentity.SameGlobalBatchAsReference/tiny/DpReplicate2",
                 "Foreign/ReplicaConsistency.ReplicasAgreeAfterEveryStep/tiny/DpReplicate2Zero",
                 "Foreign/GradientSync.EachGradientReducedOverItsDomain/tiny/DpReplicate2Zero",
                 "Foreign/OptimizerLayout.StateShapesMatchLocalShards/tiny/DpReplicate2Zero",
                 "Foreign/Structure.LocalShapesMatchPlacements/example/DpReplicate2", "64 tests", "examined",
                 "written by mih-evidence.py",
                 "Structure (6 case(s)), OptimizerLayout (6 case(s)), InputIdentity (4 case(s)), NumericParity (4 case(s)), GradientSync (4 case(s)), "
                 "ReplicaConsistency (4 case(s))",
                 "not instantiated for it: FsdpUnits (needs check/fsdp_units.json (of the case)); CheckpointRoundTrip (needs "
                 "checkpoint/roundtrip_load.json")
    for d in (ddp, zero):
        expect(f"mih compare Reference {os.path.basename(d)}", [a.mih, "compare", ref, d], 0, "match:",
               "written by mih-evidence.py")
    # A DistributedSampler's rows (rank r takes r, r + W, ...), declared row by row, equal the
    # 1-rank run; the installed example loop (shuffled sampler, DataLoader) too.
    expect("mih check, DDP over a DistributedSampler's rows declared row by row", [a.mih, "check", strided], 0,
           "Foreign/InputIdentity.SameGlobalBatchAsReference/tiny/DpReplicate2Strided",
           "Foreign/NumericParity.LossMatchesReference/tiny/DpReplicate2Strided")
    expect("mih check, the example loop on 2 ranks against its 1-rank run", [a.mih, "check", example[1]], 0,
           "Foreign/InputIdentity.SameGlobalBatchAsReference/example/DpReplicate2",
           "Foreign/NumericParity.LossMatchesReference/example/DpReplicate2")

    # The planted bugs fail, named.
    expect("mih check, each rank's loss averaged over its own targets",
           [a.mih, "check", mean], 1, "Foreign/NumericParity.LossMatchesReference/tiny/BugPerRankMean", "FAILED",
           "localized to 'loss'", "step 0")
    expect("mih compare, each rank's loss averaged over its own targets", [a.mih, "compare", ref, mean], 1, "step 0")
    expect("mih check, the last micro-batch under no_sync", [a.mih, "check", nosync], 1,
           "Foreign/NumericParity.WatchedTensorsMatchReferenceAtEveryStage/tiny/BugNoSync", "FAILED",
           "the activations and their gradients match at step 0", "weight gradient or its reduction")
    expect("mih compare, the last micro-batch under no_sync", [a.mih, "compare", ref, nosync], 1, "step 0")

    expect("mih check, rank 1's copy leaving rank 0's at the last step", [a.mih, "check", replicas], 1,
           "Foreign/ReplicaConsistency.ReplicasAgreeAfterEveryStep/tiny/BugRankLr", "step 2: parameter copies differ after the optimizer", "rank(s) 1 "
           "hold other bytes than rank 0")

    # The same strided rows declared by each micro-batch's first row, as if contiguous: the
    # inputs are those of the 1-rank run in another order, and InputIdentity says so.
    expect("mih check, a DistributedSampler's rows declared as contiguous", [a.mih, "check", as_first], 1,
           "Foreign/InputIdentity.SameGlobalBatchAsReference/tiny/BugRowsAsFirst", "FAILED")

    # Evidence that breaks the contract is refused, naming file and field.
    metrics = os.path.join(ddp, "cases", "runtime", "metrics.jsonl")
    with open(metrics) as f:
        rows = [json.loads(l) for l in f]
    rows[1]["grad_norm_pre_clip"] = "0.7"
    with open(metrics, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    expect("mih check, an edited metrics row", [a.mih, "check", ddp], 12,
           "cases/runtime/metrics.jsonl: field line 2: grad_norm_pre_clip")
    # A reference named by a path, not a sibling case: refused, never read outside the spec.
    escape = os.path.join(a.work, "escape", "tiny")
    shutil.copytree(ref, os.path.join(escape, "Reference"))
    shutil.copytree(zero, os.path.join(escape, "DpReplicate2Zero"))
    env_file = os.path.join(escape, "DpReplicate2Zero", "environment.json")
    with open(env_file) as f:
        env = json.load(f)
    env["case"]["compare_to"] = "../../good/tiny/Reference"
    with open(env_file, "w") as f:
        json.dump(env, f)
    expect("mih check, compare_to a path", [a.mih, "check", os.path.dirname(escape)], 12,
           "case.compare_to '../../good/tiny/Reference' is not a case name")
    # Each of these is bad evidence (12) or a failed check (1), never a pass.
    def variant(name, edit):
        root = os.path.join(a.work, name, "tiny")
        shutil.copytree(ref, os.path.join(root, "Reference"))
        case = os.path.join(root, "DpReplicate2Zero")
        shutil.copytree(zero, case)
        edit(case)
        return case

    def edit_lines(relative, change):
        def apply(case):
            path = os.path.join(case, relative)
            with open(path) as f:
                rows = [json.loads(l) for l in f]
            rows = change(rows)
            with open(path, "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
        return apply

    def wrong_then_right(rows):
        wrong = dict(rows[0], loss=rows[0]["loss"] + 1.0)
        return [wrong] + rows
    d = variant("duplicate", edit_lines("cases/runtime/metrics.jsonl", wrong_then_right))
    expect("mih compare, a wrong row before the right one", [a.mih, "compare", os.path.join(os.path.dirname(d), "Reference"), d],
           12, "has two rows for step 0")

    def field_edit(rows):
        rows[0]["fields"]["labels"] = "0" * 64
        return rows
    d = variant("fields", edit_lines("data/input_identity.jsonl", field_edit))
    expect("mih check, a field's hash edited under the same global hash", [a.mih, "check", d], 1,
           "Foreign/InputIdentity.SameGlobalBatchAsReference/tiny/DpReplicate2Zero",
           "differs from the reference's in field(s) labels")

    def self_reference(case):
        path = os.path.join(case, "environment.json")
        with open(path) as f:
            env = json.load(f)
        env["case"]["compare_to"] = "DpReplicate2Zero"
        with open(path, "w") as f:
            json.dump(env, f)
    d = variant("self", self_reference)
    expect("mih check, a case its own reference", [a.mih, "check", d], 12, "names the case itself")
    d = variant("noprobes", lambda case: os.remove(os.path.join(case, "probes", "rank0.jsonl")))
    expect("mih check, no probes", [a.mih, "check", d], 12, "has no probes/rank0.jsonl")
    expect("mih compare picks the dtype's tolerance", [a.mih, "compare", ref, zero], 0,
           "tolerance 1e-10 (float64's cross-topology default")
    # record_batch's rows: refused when they cannot be the batch's global rows.
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import mih_evidence
    import torch
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.int64)}
    if mih_evidence.sampler_rows(1, 2, 2, 2) != [5, 7]:
        fail(f"sampler_rows(1, 2, 2, 2) is {mih_evidence.sampler_rows(1, 2, 2, 2)}, not [5, 7]")
    for rows, needle in (([3, 3], "named twice"), ([1, 2, 3], "names 3 global rows, the batch holds 2"),
                         ([-1, 0], "[0, 2^62)"), (1.5, "got float"), (torch.tensor([0.0, 1.0]), "integers"),
                         ([0.0, 1.0], "integers"), ([], "names 0 global rows"), (2 ** 70, "[0, 2^62)"),
                         ([2 ** 70, 0], "[0, 2^62)"), (torch.tensor([[0, 1]]), "1-d")):
        try:
            mih_evidence._row_index(rows, batch)
            fail(f"record_batch rows {rows!r}: accepted")
        except ValueError as e:
            if needle not in str(e):
                fail(f"record_batch rows {rows!r}: {e} does not say {needle!r}")
    import numpy
    for args in ((3, 2, 0, 2), (0, 0, 0, 3), (-1, 2, 0, 2), (0, 2, -5, 2), (0.5, 2, 0, 2)):
        try:
            mih_evidence.sampler_rows(*args)
            fail(f"sampler_rows{args}: accepted")
        except ValueError:
            pass
    # Rows beyond the step's global batch (every rank's rows shifted): refused at the step.
    session_dir = os.path.join(a.work, "shifted", "tiny", "Reference")
    ev = mih_evidence.Session(session_dir, torch.nn.Linear(2, 2).double(), case="Reference", steps=1)
    ev.begin_step(0)
    ev.record_batch(0, 0, [1000, 1001], batch)
    try:
        ev.after_backward_before_clip(0)
        fail("rows 1000 and 1001 of a 2-row global batch: accepted")
    except ValueError as e:
        if "numbered up to 1001" not in str(e):
            fail(f"rows beyond the global batch: {e}")
    for rows, want in ((numpy.int64(4), [4, 5]), (numpy.array([1, 3]), [1, 3]), (range(4, 6), [4, 5]),
                       (numpy.array(4), [4, 5]),
                       (torch.tensor([1, 3]), [1, 3])):
        got = mih_evidence._row_index(rows, batch).tolist()
        if got != want:
            fail(f"record_batch rows {rows!r}: taken as {got}, not {want}")
    print("ok: record_batch refuses rows that cannot be the batch's global rows, takes numpy's", flush=True)
    print(f"{len(FAILED)} failure(s)")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
