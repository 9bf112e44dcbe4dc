#!/usr/bin/env python3
"""The GPU lane as far as a machine without a GPU can check it (ctest GpuSmokeDryRun, label
precision): scripts/gpu-smoke and the gpu-smoke matrix it runs.

  1. `scripts/gpu-smoke --dry-run` exits 0 without Python, torch or a GPU, and prints the build
     (CMake with the wheel's prefix, target mih), one `mih test --matrix gpu-smoke` run per lane
     (float32, bfloat16) and reference model (Llama, Moe, Vlm), the NCCL selftest (one rank per
     GPU: --gpus 3 gives -n 3, more than 8 is capped at 8) and the table's header; the runs'
     timeouts (timeout -k K T) add up to under 10 minutes
  2. `mih matrix --spec S --matrix gpu-smoke@<lane> --json` resolves for llama, moe and vlm in
     both lanes: the float64 Reference on the CPU with Gloo, every other case world size 1 on
     cuda with NCCL in the lane's dtype, nothing rejected; the table says where each case runs
  3. this machine has no GPU: `mih run` of the lane's reference fails before any rank starts
     (exit 12), naming the CUDA devices it sees; the CPU Reference of that matrix is not refused

Exit status: 0 every check held; 1 otherwise."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "gpu-smoke")
LANES = {"float32": "float32", "bfloat16": "bfloat16"}
MODELS = {"Llama": "llama", "Moe": "moe", "Vlm": "vlm"}


def run(cmd, env=None):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def dry_run(work):
    # No Python (a path that does not exist), no nvidia-smi: the dry run needs neither.
    env = dict(os.environ, PATH="/usr/bin:/bin", OUT=os.path.join(work, "out"))
    r = run([SCRIPT, "--dry-run", os.path.join(work, "no-such-python3")], env)
    check(r.returncode == 0, f"gpu-smoke --dry-run exits 0 without Python or a GPU (exit {r.returncode})", r.stdout)
    lines = r.stdout.splitlines()
    check(any(re.match(r"cmake -S \S+ -B \S+ .*-DCMAKE_PREFIX_PATH=\"\$\(\S+ -c 'import torch;"
                       r"print\(torch.utils.cmake_prefix_path\)'\)\"", l) for l in lines) and
          any(l.startswith("cmake --build ") and l.endswith("--target mih") for l in lines),
          "the dry run prints the build: CMake with the wheel's prefix, then the mih target", r.stdout)
    budget = 0
    for lane in LANES:
        for model in MODELS:
            pattern = (rf"timeout -k (\d+) (\d+) \S+/mih test --matrix gpu-smoke --dtype {lane} --prefixes {model} "
                       rf"--evidence-root \S+ --case-timeout \d+ --no-progress$")
            found = [re.match(pattern, l) for l in lines]
            found = [m for m in found if m]
            check(len(found) == 1, f"the dry run runs the {lane} lane of {model} once", r.stdout)
            budget += sum(int(m.group(1)) + int(m.group(2)) for m in found)
    selftest = [re.match(r"timeout -k (\d+) (\d+) \S+/mih selftest -n (\d+) --pg-backend nccl ", l) for l in lines]
    selftest = [m for m in selftest if m]
    check(len(selftest) == 1, "the dry run runs the NCCL selftest once", r.stdout)
    budget += sum(int(m.group(1)) + int(m.group(2)) for m in selftest)
    check(0 < budget < 600, f"the runs' timeouts add up to under 10 minutes ({budget} s)", r.stdout)
    check(any(l.split() == ["lane", "model", "cases", "passed", "failed", "max_err/tol", "wall_s", "result"]
              for l in lines), "the dry run prints the table's header", r.stdout)
    for gpus, ranks in (("3", "3"), ("12", "8")):
        g = run([SCRIPT, "--dry-run", "--gpus", gpus], env)
        check(g.returncode == 0 and re.search(rf"mih selftest -n {ranks} --pg-backend nccl ", g.stdout) is not None,
              f"--gpus {gpus}: the selftest runs {ranks} ranks", g.stdout)
    h = run([SCRIPT, "--help"], env)
    check(h.returncode == 0 and "--dry-run" in h.stdout, f"--help exits 0 (exit {h.returncode})", h.stdout)
    u = run([SCRIPT, "--dry-rnu"], env)
    check(u.returncode == 2 and "unknown option '--dry-rnu'" in u.stdout, f"a misspelt option is exit 2 ({u.returncode})",
          u.stdout)


def matrices(mih):
    for lane, dtype in LANES.items():
        for spec in MODELS.values():
            source = f"gpu-smoke@{lane}"
            r = run([mih, "matrix", "--spec", spec, "--matrix", source, "--json"])
            try:
                m = json.loads(r.stdout)
            except ValueError:
                check(False, f"{spec} {source}: `mih matrix --json` prints JSON (exit {r.returncode})", r.stdout)
                continue
            cases = {c["name"]: c for c in m["cases"]}
            ref = cases.get("Reference", {})
            check(r.returncode == 0 and ref.get("device") == "cpu" and ref.get("pg_backend") == "gloo" and
                  ref.get("config", {}).get("dtype") == "float64" and ref.get("world_size") == 1,
                  f"{spec} {source}: the float64 Reference runs on the CPU with Gloo, world size 1", r.stdout)
            lane_cases = [c for n, c in cases.items() if n != "Reference"]
            off = [c["name"] for c in lane_cases
                   if (c["device"], c["pg_backend"], c["world_size"], c["config"].get("dtype")) != ("cuda", "nccl", 1, dtype)]
            check({"LaneReference", "NoiseTwin"} <= set(cases) and len(lane_cases) > 2 and not off and not m["rejected"],
                  f"{spec} {source}: every other case ({len(lane_cases)}) runs at world size 1 on cuda with NCCL in "
                  f"{dtype}, nothing rejected (off: {off})", r.stdout)
            compared = sorted(c["name"] for c in lane_cases if c["compare_to"] == "LaneReference")
            check(cases.get("LaneReference", {}).get("compare_to") == "Reference" and
                  cases.get("NoiseTwin", {}).get("compare_to") == "Reference" and compared,
                  f"{spec} {source}: the lane's reference and twin against the oracle, {compared} against the lane's "
                  "reference", r.stdout)
    t = run([mih, "matrix", "--spec", "llama", "--matrix", "gpu-smoke@bfloat16"])
    check(t.returncode == 0 and re.search(r"Reference .* single float64 on cpu \(gloo\)", t.stdout) is not None and
          re.search(r"LaneReference .* single bfloat16 on cuda \(nccl\)", t.stdout) is not None,
          "the table says where each case runs", t.stdout)


def no_gpu_here(mih, work):
    root = os.path.join(work, "evidence")
    r = run([mih, "run", "--spec", "llama", "--matrix", "gpu-smoke@float32", "--case", "LaneReference",
             "--evidence-root", root])
    check(r.returncode == 12 and "runs 1 rank on CUDA, one GPU each, and this process sees 0 CUDA devices" in r.stdout,
          f"without a GPU the lane's reference is refused before any rank starts, naming the devices (exit "
          f"{r.returncode})", r.stdout)
    check(not os.path.exists(os.path.join(root, "llama", "LaneReference", "run")),
          "and no rank of it was launched", r.stdout)
    # The oracle of the same matrix is a CPU case: the local launcher runs it here.
    ref = run([mih, "run", "--spec", "llama", "--matrix", "gpu-smoke@float32", "--case", "Reference",
               "--evidence-root", root])
    check(ref.returncode == 0, f"the CPU Reference of the gpu-smoke matrix runs here (exit {ref.returncode})",
          ref.stdout[-3000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    dry_run(a.work)
    matrices(a.mih)
    no_gpu_here(a.mih, a.work)
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
