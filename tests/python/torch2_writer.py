#!/usr/bin/env python3
"""ctest Torch2Trainers: python/mih_evidence on torch 2.x, driven by a plain training loop of a
Hugging Face transformers model (tests/python/hf_trainer.py: a tiny LlamaForCausalLM, float64 on
the CPU, gloo) under the venv's torchrun, 1, 2 and 4 ranks:

  good/   Reference (1 rank), DpShard2 (FSDP2), Tp2Sp (DTensor tp 2 + sequence parallelism),
          DcpResume (DCP save at dp_shard 2, load at tp 2), Hsdp (dp_replicate 2 x dp_shard 2),
          DpShard2Tp2 (FSDP x TP), DpShard2Tp2Resume (DCP save at dp_shard 4, load at FSDP x TP);
          a tiny Qwen3's Reference and Tp2Sp (per-head q_norm, k_norm); hf_llama_frozen's
          Reference and DpShard2 (its final norm frozen); hf_llama_tied's Reference and Tp2Sp (the
          head tied to the embedding, tied again after the tp plan)
  bugs/   the planted bugs of hf_trainer.py, each a case against the same Reference

and checks: `mih check good` passes every case through every suite whose evidence it holds (the
FSDP x TP case through NumericParity, InputIdentity, ReplicaConsistency, GradientSync,
OptimizerLayout, Structure and FsdpUnits; the resume through CheckpointRoundTrip), the module
outputs the writer cannot place are named as not compared; `mih check bugs` fails each bug in
the suite that owns it, naming the parameter or module; mutated copies of the FSDP x TP case's
parameter table and units fail Structure and FsdpUnits; tests/python/writer_units.py (one
process) records a bf16 model and FSDP2's mixed-precision policy and refuses bad meshes.

Usage: torch2_writer.py --python <venv python with torch 2.x and transformers> --mih build/bin/mih --work DIR
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import Tally, edit_json, free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "hf_trainer.py")
TALLY = Tally()
fail = TALLY.fail
SPEC, QWEN3, TIED = "hf_llama", "hf_qwen3", "hf_llama_tied"
GOOD_2 = "DpShard2,Tp2Sp,DcpResume,hf_qwen3:Tp2Sp,hf_llama_frozen:DpShard2,hf_llama_tied:Tp2Sp"
BUGS_2 = "BugPerRankMean,BugUnsharded,BugSpNorm,BugPartialNorm,BugDcpNoOptim,BugSameRows,hf_qwen3:BugQkNorm," \
         "hf_qwen3:BugTorchClip,hf_llama_tied:BugTpUntied"
GOOD_4 = "Hsdp,DpShard2Tp2,DpShard2Tp2Resume,BugDecayNorms"


def expect(what, cmd, code, *needles):
    return TALLY.expect(what, cmd, code, needles) or ""


def launch(python, ranks, cases, good, bugs, ckpt):
    """Runs hf_trainer.py's `cases` on `ranks` ranks (torchrun of the venv beyond one)."""
    cmd = [TRAINER, "--root", good, "--bug-root", bugs, "--ckpt", ckpt, "--cases", cases]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONWARNINGS"] = "ignore"
    if ranks > 1:
        cmd = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port())] + cmd
    p = subprocess.run([python] + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400,
                       env=env)
    if p.returncode != 0:
        fail(f"hf_trainer.py {cases} on {ranks} rank(s) exited {p.returncode}:\n{p.stdout[-4000:]}")
        return False
    TALLY.ok(f"hf_trainer.py {cases} on {ranks} rank(s)")
    return True


def foreign(suite, test, case):
    return f"Foreign/{suite}.{test}/{SPEC}/{case}"


def failed(suite, test, case):
    return f"[  FAILED  ] {foreign(suite, test, case)} "


def check_good(mih, good):
    fsdp_tp = "DpShard2Tp2"
    out = expect("mih check: FSDP2, HSDP, TP + SP, FSDP x TP and a DCP resume across a reshard against the 1-rank run",
                 [mih, "check", good], 0, "Structure (13 case(s)), FsdpUnits (5 case(s)), OptimizerLayout (13 case(s)), "
                 "InputIdentity (9 case(s)), CheckpointRoundTrip (2 case(s)), NumericParity (9 case(s)), "
                 "GradientSync (9 case(s)), ReplicaConsistency (7 case(s))", f"{QWEN3}/Tp2Sp",
                 foreign("GradientSync", "EachGradientReducedOverItsDomain", "DpShard2").replace(SPEC, "hf_llama_frozen"),
                 foreign("CheckpointRoundTrip", "LoadedTensorsBitExact", "DpShard2Tp2Resume"),
                 foreign("NumericParity", "WatchedTensorsMatchReferenceAtEveryStage", fsdp_tp),
                 foreign("InputIdentity", "SameGlobalBatchAsReference", fsdp_tp),
                 foreign("ReplicaConsistency", "ReplicasAgreeAfterEveryStep", fsdp_tp),
                 foreign("GradientSync", "EachGradientReducedOverItsDomain", fsdp_tp),
                 foreign("OptimizerLayout", "NoWeightDecayOnNormsOrBiases", fsdp_tp),
                 foreign("Structure", "LocalShapesMatchPlacements", fsdp_tp),
                 foreign("FsdpUnits", "EveryShardedParameterInOneUnit", fsdp_tp),
                 foreign("CheckpointRoundTrip", "LoadedTensorsBitExact", "DcpResume"), "examined")
    if "[  FAILED  ]" in out:
        fail("mih check of the good runs printed a FAILED test")
    case = os.path.join(good, SPEC)
    expect("mih compare, tp 2 + sp: the outputs the writer cannot place are named, not compared",
           [mih, "compare", os.path.join(case, "Reference"), os.path.join(case, "Tp2Sp")], 0, "match:",
           "not compared: the outputs of", "'model.layers.0.self_attn.q_proj'")


def check_bugs(mih, bugs):
    expect("mih check: each planted bug fails the suite that owns it, naming the parameter or module",
           [mih, "check", bugs], 1,
           failed("NumericParity", "LossMatchesReference", "BugPerRankMean"), "localized to 'loss'",
           failed("GradientSync", "EachGradientReducedOverItsDomain", "BugUnsharded"),
           "the gradient of 'model.embed_tokens.weight' piece [0:64, 0:32]: rank(s) 1 hold another than rank 0 "
           "(declared reduced over: dp_shard)",
           failed("ReplicaConsistency", "ReplicasAgreeAfterEveryStep", "BugUnsharded"),
           failed("GradientSync", "EachGradientReducedOverItsDomain", "BugSpNorm"),
           "the gradient of 'model.norm.weight' piece [0:32]: rank(s) 1 hold another than rank 0 "
           "(declared reduced over: tp)", "localized to 'model.norm'",
           failed("NumericParity", "GradNormsMatchReference", "BugPartialNorm"), "localized to 'grad_norm'",
           failed("CheckpointRoundTrip", "LoadedTensorsBitExact", "BugDcpNoOptim"),
           "'lm_head.weight/exp_avg' is not bit-exact after the load",
           failed("InputIdentity", "SameGlobalBatchAsReference", "BugSameRows"),
           failed("OptimizerLayout", "NoWeightDecayOnNormsOrBiases", "BugDecayNorms"),
           "'model.layers.0.input_layernorm.weight'",
           f"[  FAILED  ] Foreign/GradientSync.EachGradientReducedOverItsDomain/{QWEN3}/BugQkNorm ",
           "the gradient of 'model.layers.0.self_attn.q_norm.weight' piece [0:8]: rank(s) 1 hold another than rank 0 "
           "(declared reduced over: tp)", "localized to 'model.layers.0.self_attn.q_norm'",
           f"[  FAILED  ] Foreign/NumericParity.GradNormsMatchReference/{QWEN3}/BugTorchClip ",
           "metric 'grad_norm_post_clip' at step 2",
           f"[  FAILED  ] Foreign/NumericParity.WatchedTensorsMatchReferenceAtEveryStage/{TIED}/BugTpUntied ",
           "parameter 'lm_head.weight'")


def mutated(good, work, case, edit):
    """A copy of `case` and the Reference with edit(case_dir) applied, as a root to check."""
    root = os.path.join(work, "mutated", edit.__name__)
    shutil.rmtree(root, ignore_errors=True)
    for name in ("Reference", case):
        shutil.copytree(os.path.join(good, SPEC, name), os.path.join(root, SPEC, name))
    edit(os.path.join(root, SPEC, case))
    return root


def q_proj_whole(case_dir):
    """rank 0's piece of q_proj recorded as the whole matrix, placements unchanged."""
    def change(table):
        for row in table["parameters"]:
            if row["fqn"] == "model.layers.0.self_attn.q_proj.weight":
                row["local_shape"] = row["global_shape"]
    edit_json(os.path.join(case_dir, "check", "structure.json"), change)


def unit_lost(case_dir):
    """the first decoder layer's unit loses its q_proj."""
    def change(units):
        for unit in units.values():
            if "model.layers.0.self_attn.q_proj.weight" in unit["parameters"]:
                unit["parameters"].remove("model.layers.0.self_attn.q_proj.weight")
    edit_json(os.path.join(case_dir, "check", "fsdp_units.json"), change)


def check_mutations(mih, good, work):
    expect("mih check: a parameter table whose local shape contradicts its placements",
           [mih, "check", mutated(good, work, "DpShard2Tp2", q_proj_whole)], 1,
           failed("Structure", "LocalShapesMatchPlacements", "DpShard2Tp2"), "model.layers.0.self_attn.q_proj.weight")
    expect("mih check: an FSDP unit table that lost a sharded parameter",
           [mih, "check", mutated(good, work, "DpShard2Tp2", unit_lost)], 1,
           failed("FsdpUnits", "EveryShardedParameterInOneUnit", "DpShard2Tp2"),
           "model.layers.0.self_attn.q_proj.weight")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True)
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    good, bugs, ckpt = (os.path.join(a.work, d) for d in ("good", "bugs", "ckpt"))
    ran = launch(a.python, 1, "Reference,hf_qwen3:Reference,hf_llama_frozen:Reference,hf_llama_tied:Reference", good,
                 bugs, ckpt)
    for spec in (SPEC, QWEN3, TIED) if ran else ():
        shutil.copytree(os.path.join(good, spec, "Reference"), os.path.join(bugs, spec, "Reference"))
    ran = ran and launch(a.python, 2, f"{GOOD_2},{BUGS_2}", good, bugs, ckpt)
    ran = ran and launch(a.python, 4, GOOD_4, good, bugs, ckpt)
    units = os.path.join(a.work, "units")
    expect("writer_units.py: a bf16 model, FSDP2 mixed precision recorded per unit, bad meshes and watch lists refused",
           [a.python, os.path.join(HERE, "writer_units.py"), "--out", units], 0, "ok: bf16", "ok: mixed",
           "ok: refusals: a mesh dim named 'data'", "ok: refusals: record_batch before begin_step",
           "ok: refusals: a step without record_batch")
    expect("mih validate: the bf16 and mixed-precision runs follow the contract",
           [a.mih, "validate", os.path.join(units, "bf16"), os.path.join(units, "mixed")], 0,
           "2 case directories, 0 not following")
    if ran:
        check_good(a.mih, good)
        check_bugs(a.mih, bugs)
        check_mutations(a.mih, good, a.work)
    return TALLY.summary("Torch2Trainers")


if __name__ == "__main__":
    sys.exit(main())
