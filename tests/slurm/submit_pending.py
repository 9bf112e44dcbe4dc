#!/usr/bin/env python3
"""ctest SlurmSubmitPending (label external): `mih submit` of a night whose jobs are still
queued is refused under a real SLURM (tests/slurm/slurm_cluster.py), issue 53.

The node drained, `mih submit --cases Reference` queues its two jobs (PENDING); the same `mih
submit` again is exit 12 naming both job ids and the fix (scancel, or wait), submits nothing and
leaves jobs.json with the first set's ids. With the jobs cancelled, it submits again (exit 0).

Skipped (exit 77) with the reason when not root or when the daemons cannot start.

Usage: submit_pending.py --mih build/bin/mih --work DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_cluster import Skip, SlurmCluster  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import Tally, mih_and_work  # noqa: E402

TALLY = Tally()


def jobs_of(root):
    with open(os.path.join(root, ".mih-submit", "llama", "jobs.json")) as f:
        return json.load(f)


def queued(cluster):
    p = cluster.run(["/usr/bin/squeue", "--noheader", "--format=%i"])
    return set(p.stdout.split())


def main():
    mih, work = mih_and_work()
    root = os.path.join(work, "night")
    submit = [mih, "submit", "--spec", "llama", "--cases", "Reference", "--evidence-root", root]
    try:
        with SlurmCluster(os.path.join(work, "slurm"), cpus=4) as cluster:
            p = cluster.run(["/usr/bin/scontrol", "update", f"NodeName={cluster.host}", "State=DRAIN",
                             "Reason=mih-test"])
            if p.returncode != 0:
                TALLY.fail(f"scontrol could not drain the node: {p.stdout}")
                return TALLY.summary("SlurmSubmitPending")
            first = cluster.run(submit, timeout=120)
            if first.returncode != 0:
                TALLY.fail(f"the first mih submit: exit {first.returncode}\n{first.stdout}")
                return TALLY.summary("SlurmSubmitPending")
            ids = sorted(jobs_of(root).values())
            TALLY.ok(f"the first mih submit queues jobs {' '.join(ids)} on the drained node")
            before = queued(cluster)
            again = cluster.run(submit, timeout=120)
            added = sorted(queued(cluster) - before)
            if again.returncode == 12 and all(i in again.stdout for i in ids) and "scancel" in again.stdout \
                    and not added and sorted(jobs_of(root).values()) == ids:
                TALLY.ok("mih submit again while they are queued: exit 12 naming them and scancel, nothing submitted")
            else:
                TALLY.fail(f"mih submit again while the jobs are queued: exit {again.returncode}, jobs added "
                           f"{added}, jobs.json {jobs_of(root)}\n{again.stdout[-2000:]}")
            for job in queued(cluster):
                cluster.run(["/usr/bin/scancel", job])
            cluster.wait(ids + added, timeout=60)
            cluster.run(["/usr/bin/scontrol", "update", f"NodeName={cluster.host}", "State=RESUME"])
            third = cluster.run(submit, timeout=120)
            if third.returncode == 0:
                TALLY.ok("mih submit once the jobs are cancelled: exit 0")
            else:
                TALLY.fail(f"mih submit once the jobs are cancelled: exit {third.returncode}\n{third.stdout[-2000:]}")
            rest = sorted(queued(cluster))
            for job in rest:
                cluster.run(["/usr/bin/scancel", job])
            cluster.wait(rest, timeout=60)
    except Skip as e:
        print(f"skipped: {e}")
        return 77
    return TALLY.summary("SlurmSubmitPending")


if __name__ == "__main__":
    sys.exit(main())
