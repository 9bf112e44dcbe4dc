#!/usr/bin/env python3
"""A missing golden of the original model and `mih test --no-golden` (ctest NoGolden, label
runtime; issue 52), black box through the real `mih`: a golden that is missing stops the run
before any case (exit 12) naming the fix, `mih golden` or `--no-golden`; `--no-golden` with
`--golden` is a usage error (exit 2); under `--no-golden` the llama's Reference runs every other
suite and no MatchesOriginal test (not instantiated, never a pass), the run's last line says
"MatchesOriginal not run: --no-golden", and so does `mih report` of its root (md and html).

Exit status: 0 every check held; 1 otherwise."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from outcomes import FAILURES, check  # noqa: E402
from testkit import mih_and_work, run  # noqa: E402

NOT_RUN = "MatchesOriginal not run: --no-golden"


def main():
    mih, work = mih_and_work()
    w = lambda name: os.path.join(work, name)  # noqa: E731
    only = ["--only-spec", "llama", "--gtest_filter=Llama/*.*/Reference"]

    root = w("missing")
    rc, out = run([mih, "test", "--golden", w("nope"), "--evidence-root", root] + only)
    check(rc == 12 and "is not a directory" in out and "--no-golden" in out and "mih golden" in out
          and not os.path.exists(os.path.join(root, "llama")),
          "a missing golden stops the run before any case (exit 12), naming `mih golden` and --no-golden", out[-2000:])

    rc, out = run([mih, "test", "--no-golden", "--golden", w("nope"), "--evidence-root", w("both")] + only)
    check(rc == 2 and "--no-golden" in out and "--golden" in out, "--no-golden with --golden is a usage error (exit 2)",
          out[-2000:])

    root = w("no-golden")
    rc, out = run([mih, "test", "--no-golden", "--no-progress", "--gtest_brief=1", "--evidence-root", root] + only)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    check(rc == 0 and last == "mih: " + NOT_RUN, "under --no-golden the run passes and its last line says '%s'" % NOT_RUN,
          out[-2000:])
    suites = set()
    if os.path.exists(os.path.join(root, "results.jsonl")):
        with open(os.path.join(root, "results.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "name" in j and j.get("status") == "passed":
                    suites.add(j["suite"])
    check("MatchesOriginal" not in suites and {"Structure", "DataContract"} <= suites,
          "under --no-golden no MatchesOriginal test ran and every other suite did (%d suites passed)" % len(suites),
          str(sorted(suites)))
    for fmt in ("md", "html"):
        rc, text = run([mih, "report", root, "--format", fmt])
        check(rc == 0 and NOT_RUN in text, "mih report --format %s of that root says '%s'" % (fmt, NOT_RUN), text[:1500])

    # A root that compared with the golden, then verified under --no-golden: its report counts
    # MatchesOriginal's tests, so it does not also say MatchesOriginal never ran.
    judged = w("judged")
    rc, out = run([mih, "test", "--no-progress", "--evidence-root", judged] + only)
    rc2, out2 = run([mih, "test", "--no-golden", "--verify-only", "--no-progress", "--evidence-root", judged] + only)
    rc3, text = run([mih, "report", judged, "--format", "md"])
    check(rc == 0 and rc2 == 0 and rc3 == 0 and "| MatchesOriginal |" in text and NOT_RUN not in text,
          "a root that compared with the golden, verified under --no-golden: the report counts MatchesOriginal and "
          "does not say it never ran (exit %s, %s, %s)" % (rc, rc2, rc3), text[:1500] + out[-500:] + out2[-500:])

    print("%d check(s) failed" % len(FAILURES) if FAILURES else "every check held")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
