#!/usr/bin/env python3
"""Correct ports stay green, and what they do not train stays put (ctest CorrectPortsPass, label
runtime), black box through the real `mih`:

  1. mixed instruction data: the vlm_mixed spec (the vlm whose step-1 global batch is text only)
     passes every suite on DpShard2 and its Reference: SharedState (the vision features are not
     required in a step without pixel_values), CommVolume (the vision tower's FSDP unit, which
     the text-only step never runs, moves nothing then) and the rest;
  2. a parameter without a gradient is not moved: on that text-only step the vision tower and
     the projector get no gradient on any rank, and the optimizer leaves them exactly as they
     were (the probes after the optimizer at steps 0 and 1 are equal; at step 2, with images
     again, they move), on the case and on its single-rank reference; GradientPresence passes;
  3. a cross-topology resume into activation checkpointing (dp_shard=2 -> dp_shard=2 with AC)
     passes ActivationCheckpointEquivalence: the load phase records its regions and the
     comparison with the run without checkpointing starts at the resume step;
  4. and a port whose vision tower never trains is named: the vlm with fault F19 (vision
     features detached before the projector: the tower gets no gradient at any step) fails
     GradientPresence.EveryTrainableParameterGetsAGradient with MIH-GRAD-004 naming the tower,
     and ModalityGradients still catches F19 (MIH-MODAL-001).

Exit status: 0 every check held; 1 otherwise."""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def results(root):
    path = os.path.join(root, "results.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "run" not in r]


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def after_optimizer(case_dir):
    """step -> {fqn: (sum, sum_sq, sketch)} of the parameters after the optimizer."""
    out = {}
    for line in jsonl(os.path.join(case_dir, "probes", "rank0.jsonl")):
        if line["stage"] == "after_optimizer":
            out[line["step"]] = {n: (t["sum"], t["sum_sq"], tuple(t["sketch"])) for n, t in line["tensors"].items()}
    return out


def suites_passed(root, case, suites):
    mine = [r for r in results(root) if r["case"] == case]
    failed = [f"{r['suite']}.{r['test']}: {r.get('message', '')[:300]}" for r in mine if r["status"] != "passed"]
    ran = {r["suite"] for r in mine}
    return mine, failed, sorted(set(suites) - ran)


def mixed_data(mih, work):
    root = os.path.join(work, "mixed")
    r = run([mih, "test", "--prefixes", "VlmMixed", "--evidence-root", root, "--no-progress", "--gtest_brief=1",
             "--gtest_filter=VlmMixed/*.*/DpShard2"])
    mine, failed, missing = suites_passed(root, "DpShard2", ["SharedState", "CommVolume", "GradientPresence",
                                                             "NumericParity", "ModalityGradients", "FsdpUnits"])
    check(r.returncode == 0 and mine and not failed and not missing,
          f"vlm_mixed/DpShard2 (step 1 text only) passes all {len(mine)} tests, SharedState and CommVolume among "
          f"them (exit {r.returncode})", "\n".join(failed + [f"not run: {missing}"]) + "\n" + r.stdout[-3000:])
    case = os.path.join(root, "vlm_mixed", "DpShard2")
    try:
        rows = {m["step"]: m for m in jsonl(os.path.join(case, "cases", "runtime", "metrics.jsonl"))}
        gathers = {s: rows[s].get("fsdp_gather_forwards", {}) for s in rows}
        tower = "vision_tower.embeddings.patch_embedding.weight"
        check(gathers.get(0, {}).get(tower) == 1 and tower not in gathers.get(1, {tower: 1}),
              f"FSDP gathered the vision tower at step 0, not at the text-only step 1 ({len(gathers.get(0, {}))} "
              f"parameters gathered at step 0, {len(gathers.get(1, {}))} at step 1)")
        shared = json.load(open(os.path.join(case, "cases", "runtime", "shared_state_step1.json")))
        check(shared.get("not_required") == ["vision.features"],
              f"step 1's shared-state record: vision.features not required without pixel_values ({shared.get('not_required')})")
        presence = json.load(open(os.path.join(case, "cases", "runtime", "gradient_presence_step1.json")))
        check("vision_tower.embeddings.patch_embedding.weight" in presence.get("without_gradient", []) and presence.get("moved") == {},
              f"step 1: {len(presence.get('without_gradient', []))} parameters without a gradient on any rank, none "
              f"moved by the optimizer ({presence.get('moved')})")
    except (OSError, ValueError, KeyError) as e:
        check(False, "vlm_mixed/DpShard2 evidence is readable", str(e))
    for name in ("DpShard2", "Reference"):
        try:
            p = after_optimizer(os.path.join(root, "vlm_mixed", name))
        except (OSError, ValueError, KeyError) as e:
            check(False, f"vlm_mixed/{name} probes are readable", str(e))
            continue
        vision = sorted(n for n in p.get(0, {}) if n.startswith(("vision_tower.", "multi_modal_projector.")))
        still = [n for n in vision if p[1][n] == p[0][n]]
        # CLIP's post_layernorm trains at no step: LLaVA's forward never reads it.
        trained = [n for n in vision if not n.startswith("vision_tower.post_layernorm.")]
        moved_again = [n for n in trained if p[2][n] != p[1][n]]
        check(vision and len(still) == len(vision),
              f"vlm_mixed/{name}: the optimizer left all {len(vision)} vision and projector parameters exactly as "
              f"they were at the text-only step 1 (unchanged: {len(still)})",
              "moved without a gradient: " + ", ".join(sorted(set(vision) - set(still))[:6]))
        check(trained and len(moved_again) == len(trained),
              f"vlm_mixed/{name}: with images again at step 2 they train ({len(moved_again)} of {len(trained)} moved)")


def resume_into_checkpointing(mih, work):
    root = os.path.join(work, "ac-resume")
    matrix = os.path.join(work, "ac_resume.json")
    with open(matrix, "w") as f:
        json.dump({"name": "ac-resume", "dtype": "float64", "device": "cpu", "pg_backend": "gloo", "steps": 3,
                   "max_world_size": 4,
                   "cases": [{"dp_shard": 2},
                             {"kind": "cross_resume", "save": {"dp_shard": 2},
                              "load": {"dp_shard": 2, "activation_checkpointing": True}, "resume_at": 2}]}, f)
    case = "ResumeDpShard2ToDpShard2Ac"
    r = run([mih, "test", "--only-spec", "llama", "--matrix", matrix, "--evidence-root", root, "--no-progress",
             "--gtest_brief=1", f"--gtest_filter=Llama/*.*/{case}"])
    mine, failed, missing = suites_passed(root, case, ["ActivationCheckpointEquivalence", "Resume", "NumericParity"])
    ac = [x for x in mine if x["suite"] == "ActivationCheckpointEquivalence"]
    check(r.returncode == 0 and len(ac) >= 2 and not failed and not missing,
          f"llama/{case} passes all {len(mine)} tests, {len(ac)} of ActivationCheckpointEquivalence (exit "
          f"{r.returncode})", "\n".join(failed + [f"not run: {missing}"]) + "\n" + r.stdout[-3000:])
    path = os.path.join(root, "llama", case, "check", "activation_checkpoint.json")
    check(os.path.exists(path) and json.load(open(path)).get("enabled") is True,
          "the load phase (steps 2..) wrote check/activation_checkpoint.json")


def never_trained(mih, work):
    root = os.path.join(work, "never-trained")
    r = run([mih, "test", "--prefixes", "Vlm", "--evidence-root", root, "--no-progress", "--gtest_brief=1",
             "--fault", "F19", "--fault-cases", "DpShard2",
             "--gtest_filter=Vlm/GradientPresence.*/DpShard2:Vlm/ModalityGradients.*/DpShard2"])
    mine = [x for x in results(root) if x["case"] == "DpShard2"]
    failed = {f"{x['suite']}.{x['test']}": x.get("message", "") for x in mine if x["status"] != "passed"}
    never = failed.get("GradientPresence.EveryTrainableParameterGetsAGradient", "")
    check(r.returncode == 1 and "MIH-GRAD-004" in never and "vision_tower.embeddings.patch_embedding.weight" in never
          and "no rank's backward gave it a gradient in any of the" in never,
          f"vlm/DpShard2 with F19: GradientPresence names the vision tower that never trains (exit {r.returncode})",
          (never or "GradientPresence.EveryTrainableParameterGetsAGradient did not fail") + "\n" + r.stdout[-3000:])
    check("GradientPresence.OptimizerLeavesParametersWithoutGradient" not in failed
          and any(x["suite"] == "GradientPresence" for x in mine),
          "and its optimizer left the tower as it was (OptimizerLeavesParametersWithoutGradient passed)")
    modal = failed.get("ModalityGradients.ModalityParametersReceiveGradients", "")
    check("MIH-MODAL-001" in modal and "vision_tower." in modal,
          "ModalityGradients still catches F19 (MIH-MODAL-001 names the tower)", modal or r.stdout[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    mixed_data(a.mih, a.work)
    resume_into_checkpointing(a.mih, a.work)
    never_trained(a.mih, a.work)
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
