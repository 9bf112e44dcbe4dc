#!/bin/sh
# Stands in for `srun -n N <cmd>` in tests of the launcher's command-template mode: starts N
# copies of the command with SLURM's task variables, waits for all, fails if any failed.
n=$1
shift
pids=""
i=0
while [ "$i" -lt "$n" ]; do
  SLURM_PROCID=$i SLURM_NTASKS=$n SLURM_LOCALID=$i SLURM_NODEID=0 SLURM_TASKS_PER_NODE=$n "$@" &
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do
  wait "$p" || rc=$?
done
exit "$rc"
