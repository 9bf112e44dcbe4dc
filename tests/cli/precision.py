#!/usr/bin/env python3
"""Reduced-precision lanes (ctest PrecisionLanes, label precision): the llama's cpu-precision
matrix in float32 and in bfloat16 (autocast, float32 master weights), each case compared with
its lane's reference at tolerances calibrated from the noise twin, and the checks proven able
to fail.

  1. per lane: `mih test --matrix cpu-precision --dtype D` (NumericParity) passes; every case
     wrote compare/calibration.json with each quantity's error, noise and tolerance, the lane's
     reference and twin against float64 at the oracle factor; one line per case is printed
     (quantities, largest error / tolerance and error / noise)
  2. per lane: the Markdown report has the precision section and the HTML report the heat map
  3. per lane: fault F01 (the final norm's gradient a partial sum under sequence parallelism)
     injected in Tp2Sp fails NumericParity, naming norm.weight, with its error / noise
  4. float32: k = 0 (an uncalibrated tolerance: the floor alone) fails the correct port

Exit status: 0 every check held; 1 otherwise."""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402

CASES = ["LaneReference", "NoiseTwin", "DpShard2", "Tp2Sp", "Cp2Zz"]


def mih_test(mih, root, dtype, *extra):
    cmd = [mih, "test", "--matrix", "cpu-precision", "--dtype", dtype, "--prefixes", "Llama", "--evidence-root", root,
           "--no-progress"] + list(extra)
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summary(cal):
    rows = cal["quantities"]
    ratios = [r["error_over_noise"] for r in rows if r["error_over_noise"] is not None]
    return (f"{len(rows)} quantities, largest error / tolerance {cal['max_error_over_tolerance']:.3g} "
            f"({cal['worst']}), largest error / noise {max(ratios):.3g}, factor {cal['factor']:g}")


def lane(mih, work, dtype):
    root = os.path.join(work, dtype)
    r = mih_test(mih, root, dtype, "--gtest_filter=Llama/NumericParity.*")
    check(r.returncode == 0, f"{dtype}: NumericParity passes on the correct port (exit {r.returncode})", r.stdout[-4000:])
    for case in CASES:
        path = os.path.join(root, "llama", case, "compare", "calibration.json")
        try:
            cal = json.load(open(path))
        except (OSError, ValueError) as e:
            check(False, f"{dtype}/{case}: compare/calibration.json is readable", str(e))
            continue
        rows = cal.get("quantities", [])
        complete = bool(rows) and all(
            r["noise"] is not None and r["tolerance"] > 0 and r["error"] is not None for r in rows)
        stages = {r["stage"] for r in rows}
        check(cal.get("dtype") == dtype and complete and {"metrics", "forward_output", "grad_before_clip",
                                                           "optimizer_state"} <= stages,
              f"{dtype}/{case}: every quantity has its error, noise and tolerance ({len(rows)}; stages "
              f"{sorted(stages)})")
        oracle = case in ("LaneReference", "NoiseTwin")
        check((cal.get("factor") != 1) == oracle and cal.get("reference") == ("Reference" if oracle else "LaneReference"),
              f"{dtype}/{case}: compared with {cal.get('reference')} at factor {cal.get('factor')}")
        print(f"      {dtype}/{case}: {summary(cal)}")
    for fmt, marker in (("md", "## Precision lanes"), ("html", 'table class="heat"')):
        rep = subprocess.run([mih, "report", root, "--format", fmt], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        check(rep.returncode == 0 and marker in rep.stdout and "llama / Tp2Sp" in rep.stdout,
              f"{dtype}: the {fmt} report shows the calibration ({marker!r})", rep.stdout[-1500:])
    # A real bug of the catalog in this lane.
    fault_root = os.path.join(work, dtype + "-F01")
    r = mih_test(mih, fault_root, dtype, "--fault", "F01", "--fault-cases", "Tp2Sp",
                 "--gtest_filter=Llama/NumericParity.WatchedTensorsMatchReferenceAtEveryStage/Tp2Sp")
    check(r.returncode == 1 and "norm.weight" in r.stdout and "error / noise" in r.stdout,
          f"{dtype}: F01 in Tp2Sp fails NumericParity, naming norm.weight with its error / noise (exit {r.returncode})",
          r.stdout[-3000:])
    for line in r.stdout.splitlines():
        if "first divergence" in line:
            print("      " + line.strip()[:400])
            break
    return root


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    roots = {dtype: lane(a.mih, a.work, dtype) for dtype in ("float32", "bfloat16")}
    # k = 0: the tolerance is the floor alone, below the rounding a correct parallel run has.
    r = mih_test(a.mih, roots["float32"], "float32", "--noise-k", "0",
                 "--gtest_filter=Llama/NumericParity.WatchedTensorsMatchReferenceAtEveryStage/Tp2Sp")
    check(r.returncode == 1 and "error / noise" in r.stdout,
          f"float32: k = 0 fails the correct port's Tp2Sp (exit {r.returncode})", r.stdout[-3000:])
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
